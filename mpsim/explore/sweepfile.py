"""Scenario files with a ``sweep:`` block, and the sweep a command line asks for.

The ``sweep:`` block is not part of a scenario (the scenario model refuses unknown
fields), so it is taken out here: ``read_sweep`` returns the file's axes, and
``load_point`` loads the scenario without the block, with the point's overrides applied,
through the loader's own steps (references, ``--set``, validation, file-and-field error
lines).
"""

from __future__ import annotations

from pathlib import Path

from mpsim.errors import InputError
from mpsim.explore.axes import Axis, axes_from_args, axes_from_yaml
from mpsim.paths import display_path
from mpsim.specs import LoadedScenario
from mpsim.specs.loader import SWEEP_KEY, load_scenario, read_scenario_file



def scenario_file(path: str | Path) -> Path:
    """The scenario file a path or a shipped scenario's name refers to."""
    return read_scenario_file(path)[0]


def read_sweep(path: str | Path) -> list[Axis]:
    """The axes of the file's ``sweep:`` block (empty when it has none)."""
    file, tree = read_scenario_file(path)
    if SWEEP_KEY not in tree:
        return []
    return axes_from_yaml(tree[SWEEP_KEY], display_path(file))


def load_point(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """Load a scenario file, ignoring its ``sweep:`` block, with ``overrides`` applied."""
    return load_scenario(path, overrides)


def merge_axes(file_axes: list[Axis], grid: list[str], zip_: list[str]) -> list[Axis]:
    """The file's axes with the command line's added; a field given on the command line replaces the file's."""
    cli_axes = axes_from_args(grid, zip_)
    cli_fields = {name for axis in cli_axes for name in axis.fields}
    kept = []
    for axis in file_axes:
        overlap = cli_fields.intersection(axis.fields)
        if overlap and len(axis.fields) > 1:
            raise InputError(f"{sorted(overlap)[0]} is zipped with {', '.join(f for f in axis.fields if f not in overlap)} "
                             f"in the file's sweep block; sweep the whole group on the command line or neither",
                             "--sweep")
        if not overlap:
            kept.append(axis)
    return kept + cli_axes
