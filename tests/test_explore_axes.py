"""Sweep syntax: values, ranges, grids, zips, the scenario file's sweep block."""

from __future__ import annotations

import pytest
import yaml

from mpsim.errors import InputError
from mpsim.explore.axes import axes_from_args, axes_from_yaml, expand, override_text, parse_assignment, parse_values
from mpsim.explore.sweepfile import load_point, merge_axes, read_sweep
from tests.conftest import SCENARIOS


@pytest.mark.parametrize("text, values", [
    ("1,2,4,8", [1, 2, 4, 8]),
    ("1..5", [1, 2, 3, 4, 5]),
    ("2..16:6", [2, 8, 14]),
    ("2^0..3", [1, 2, 4, 8]),
    ("dgx-a100,dgx-h100", ["dgx-a100", "dgx-h100"]),
    ("true,false", [True, False]),
    ('"400 Gb/s","800 Gb/s"', ["400 Gb/s", "800 Gb/s"]),
    ("[1,2],[3]", [[1, 2], [3]]),
    ("0.5", [0.5]),
])
def test_values(text, values):
    assert parse_values(text, "test") == values


@pytest.mark.parametrize("text", ["8..1", "1..4:0", "2^3..1", "1,,2", "1..100000000"])
def test_bad_values_are_input_errors(text):
    with pytest.raises(InputError):
        parse_values(text, "test")


def test_assignment_needs_a_field_and_values():
    assert parse_assignment("parallel.tp=1,2") == ("parallel.tp", [1, 2])
    with pytest.raises(InputError, match="FIELD=VALUES"):
        parse_assignment("parallel.tp")
    with pytest.raises(InputError, match="field path"):
        parse_assignment("parallel tp=1")


def test_grid_is_a_product_first_axis_slowest():
    points = expand(axes_from_args(["parallel.tp=1,2", "parallel.pp=1..3"]))
    assert points == [
        (("parallel.tp", 1), ("parallel.pp", 1)), (("parallel.tp", 1), ("parallel.pp", 2)),
        (("parallel.tp", 1), ("parallel.pp", 3)), (("parallel.tp", 2), ("parallel.pp", 1)),
        (("parallel.tp", 2), ("parallel.pp", 2)), (("parallel.tp", 2), ("parallel.pp", 3)),
    ]


def test_zipped_fields_vary_together_and_cross_the_grid():
    axes = axes_from_args(["parallel.tp=1,2"], ["cluster.system=dgx-a100,dgx-h100", "cluster.nodes=16,8"])
    points = expand(axes)
    assert len(points) == 4
    assert points[0] == (("parallel.tp", 1), ("cluster.system", "dgx-a100"), ("cluster.nodes", 16))
    assert points[1] == (("parallel.tp", 1), ("cluster.system", "dgx-h100"), ("cluster.nodes", 8))


def test_zip_of_unequal_lengths_is_refused():
    with pytest.raises(InputError, match="same number of values"):
        axes_from_args([], ["parallel.tp=1,2", "parallel.pp=1,2,4"])


def test_a_field_swept_twice_is_refused():
    with pytest.raises(InputError, match="swept twice"):
        expand(axes_from_args(["parallel.tp=1,2", "parallel.tp=4"]))


def test_a_misspelled_schedule_or_system_is_refused_before_any_point_runs():
    # a typo, not a point that turns out invalid: the whole sweep stops with one line
    with pytest.raises(InputError, match="unknown schedule 'nope'") as caught:
        expand(axes_from_args(["parallel.schedule=1f1b,nope"]))
    assert str(caught.value).startswith("--sweep parallel.schedule: unknown schedule")
    with pytest.raises(InputError, match="unknown system 'hgx-h20'; did you mean hgx-h200"):
        expand(axes_from_args([], ["cluster.system=dgx-h100,hgx-h20", "cluster.nodes=4,4"]))
    # known names, aliases, torch's class names and schedule files pass; systems by the names
    # every command takes (a file's own name: gaudi2-node is in gaudi2_hls.yaml)
    assert len(expand(axes_from_args(["parallel.schedule=1f1b,ZB1P,ScheduleGPipe,file:my.txt"]))) == 4
    assert len(expand(axes_from_args(["cluster.system=gaudi2-node,dgx-2,dgx-h100"]))) == 3


def test_override_text_reads_back_as_the_value():
    for value in (4, 0.25, True, "dgx-h100", "400 Gb/s", "1f1b", [1, 2, 3], "true", "8"):
        text = override_text("a.b", value)
        assert yaml.safe_load(text.split("=", 1)[1]) == value


def test_sweep_block_in_a_scenario_file(tmp_path):
    base = yaml.safe_load((SCENARIOS / "llama3_70b_32xh100.yaml").read_text())
    base["sweep"] = {"parallel.pp": "2^1..2", "zip": {"parallel.tp": [8, 4], "parallel.microbatch_size": [1, 2]}}
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    axes = read_sweep(path)
    assert [a.fields for a in axes] == [("parallel.pp",), ("parallel.tp", "parallel.microbatch_size")]
    assert len(expand(axes)) == 4
    # the scenario loads without its sweep block, with a point's overrides applied
    loaded = load_point(path, ["parallel.tp=4", "parallel.pp=2"])
    assert (loaded.scenario.parallel.tp, loaded.scenario.parallel.pp) == (4, 2)
    # a command-line axis replaces the file's axis of the same field
    merged = merge_axes(axes, ["parallel.pp=8"], [])
    assert [a.values for a in merged if a.fields == ("parallel.pp",)] == [((8,),)]
    with pytest.raises(InputError, match="zipped"):
        merge_axes(axes, ["parallel.tp=8"], [])


def test_bad_sweep_block_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nsweep: [1, 2]\n")
    with pytest.raises(InputError) as error:
        axes_from_yaml(yaml.safe_load(path.read_text())["sweep"], str(path))
    assert "bad.yaml" in str(error.value)


def test_a_malformed_range_is_refused_not_taken_as_a_value():
    with pytest.raises(InputError, match=r"range '2\^a\.\.3'"):
        axes_from_args(["parallel.tp=2^a..3"])
    with pytest.raises(InputError, match=r"range '1\.\.x'"):
        axes_from_args(["parallel.tp=1..x"])
    # a path with ".." is a value
    [axis] = axes_from_args(["parallel.schedule=file:../mine.txt"])
    assert axis.values == (("file:../mine.txt",),)
