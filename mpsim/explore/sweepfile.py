"""Scenario files with a ``sweep:`` block, and the sweep a command line asks for.

The ``sweep:`` block is not part of a scenario (the scenario model refuses unknown
fields), so it is taken out here: ``read_sweep`` returns the file's axes, and
``load_point`` loads the scenario without the block, with the point's overrides applied,
through the same loader steps as ``mpsim.specs.load_scenario`` (references, ``--set``,
validation, file-and-field error lines). A file without the block goes straight to
``load_scenario``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mpsim.errors import InputError
from mpsim.explore.axes import Axis, axes_from_args, axes_from_yaml
from mpsim.paths import display_path
from mpsim.specs import LoadedScenario, load_scenario
from mpsim.specs.loader import (Origins, apply_override, find_reference, parse_override, read_yaml,
                                resolve_references, validation_error)
from mpsim.specs.scenario import Scenario

SWEEP_KEY = "sweep"


def scenario_file(path: str | Path) -> Path:
    """The scenario file a path or a shipped scenario's name refers to."""
    file = Path(path)
    if file.is_file():
        return file
    try:
        return find_reference(str(path), "scenario", None)
    except InputError:
        raise InputError("scenario file not found", str(path)) from None


def _tree(file: Path) -> dict[str, Any]:
    tree = read_yaml(file)
    if not isinstance(tree, dict):
        raise InputError("a scenario file must be a mapping of fields (name, cluster, model, parallel)",
                         display_path(file))
    return tree


def read_sweep(path: str | Path) -> list[Axis]:
    """The axes of the file's ``sweep:`` block (empty when it has none)."""
    file = scenario_file(path)
    tree = _tree(file)
    if SWEEP_KEY not in tree:
        return []
    return axes_from_yaml(tree[SWEEP_KEY], display_path(file))


def load_point(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """Load a scenario file, ignoring its ``sweep:`` block, with ``overrides`` applied."""
    file = scenario_file(path)
    tree = _tree(file)
    if SWEEP_KEY not in tree:
        return load_scenario(file, overrides)
    tree = {key: value for key, value in tree.items() if key != SWEEP_KEY}
    label = display_path(file)
    origins = Origins({(): label})
    base_dirs = {(): file.parent}
    for text in overrides:
        field_path, value = parse_override(text)
        apply_override(tree, field_path, value, origins, base_dirs, f"--set {text}")
    resolve_references(tree, origins, base_dirs)
    try:
        scenario = Scenario.model_validate(tree)
    except ValidationError as exc:
        raise validation_error(exc, origins) from None
    return LoadedScenario(scenario, origins, file)


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
