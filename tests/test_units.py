import pytest

from mpsim.units import parse_quantity


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
