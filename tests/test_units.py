import pytest

from mpsim.units import format_need, parse_quantity


@pytest.mark.parametrize("text,dimension,expected", [
    ("900 GB/s", "bandwidth", 900e9),
    ("400 Gb/s", "bandwidth", 50e9),
    ("80 GiB", "bytes", 80 * 2**30),
    ("80 GB", "bytes", 80e9),
    ("2.5 us", "time", 2.5e-6),
    ("2.5 µs", "time", 2.5e-6),
    ("14 ms", "time", 0.014),
    ("989 TFLOP/s", "flop_rate", 989e12),
    ("1.5e3 MB", "bytes", 1.5e9),
    (42, "bytes", 42.0),
    ("7", "time", 7.0),
])
def test_parses_units(text, dimension, expected):
    assert parse_quantity(text, dimension) == pytest.approx(expected)


@pytest.mark.parametrize("text,dimension,fragment", [
    ("80 GB", "bandwidth", "is a bytes"),
    ("900 GB/s", "bytes", "is a bandwidth"),
    ("12 parsecs", "time", "unknown unit"),
    ("fast", "bandwidth", "expected a bandwidth"),
    (True, "bytes", "expected a bytes"),
    ("inf GB", "bytes", "expected"),
])
def test_rejects_wrong_units(text, dimension, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_quantity(text, dimension)


def test_a_need_just_over_capacity_names_the_excess():
    capacity = 80 * 2**30
    # 4 MiB over rounds to the same "80.00 GiB": the excess is spelled out
    assert format_need(capacity + 4 * 2**20, capacity) == "80.00 GiB of 80.00 GiB (4.00 MiB over)"
    # a visible difference or a need that fits prints as before
    assert format_need(capacity + 2**30, capacity) == "81.00 GiB of 80.00 GiB"
    assert format_need(capacity, capacity) == "80.00 GiB of 80.00 GiB"
