"""The hardware library: accelerators and systems by name, outside of any scenario.

Scenarios reach their system through ``cluster.system``; the ``hardware`` and
``collective`` commands and the benchmarks need a system or an accelerator on its own.
Names resolve the way scenario references do (file stem or ``name`` field, case and
``-``/``_`` ignored, or a path), and problems are the same one-line input errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from mpsim.errors import InputError
from mpsim.paths import display_path
from mpsim.specs.accelerator import AcceleratorSpec
from mpsim.specs.loader import override_label, Origins, apply_override, available, find_reference, parse_override, \
    validation_error
from mpsim.specs.system import SystemSpec
from mpsim.specs.yamlio import read_yaml


def _mapping(path: Path, kind: str) -> dict[str, Any]:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(f"a {kind} file must be a mapping of fields, got {type(data).__name__}", display_path(path))
    return data


def _validate(model: type[BaseModel], tree: dict[str, Any], origins: Origins) -> Any:
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise validation_error(exc, origins, root=model) from None


def system_names() -> list[str]:
    """Names of the shipped (and $MPSIM_PATH) systems."""
    return available("system")


def accelerator_names() -> list[str]:
    """Names of the shipped (and $MPSIM_PATH) accelerators."""
    return available("accelerator")


def system_file(name: str) -> Path:
    """The file of system ``name``."""
    return find_reference(name, "system", None)


def accelerator_file(name: str) -> Path:
    """The file of accelerator ``name``."""
    return find_reference(name, "accelerator", None)


def load_accelerator(name: str) -> AcceleratorSpec:
    """An accelerator by name or path."""
    path = accelerator_file(name)
    return _validate(AcceleratorSpec, _mapping(path, "accelerator"), Origins({(): display_path(path)}))


def load_system(name: str, overrides: list[str] | tuple[str, ...] = ()) -> SystemSpec:
    """A system by name or path, with ``FIELD=VALUE`` overrides relative to the system."""
    path = system_file(name)
    tree = _mapping(path, "system")
    origins = Origins({(): display_path(path)})
    accelerator = tree.get("accelerator")
    if isinstance(accelerator, str):
        try:
            accelerator_path = find_reference(accelerator, "accelerator", path.parent)
        except InputError as exc:
            raise InputError(exc.message, display_path(path), "accelerator") from None
        tree["accelerator"] = _mapping(accelerator_path, "accelerator")
        origins.sources[("accelerator",)] = display_path(accelerator_path)
    for text in overrides:
        field, value = parse_override(text)
        apply_override(tree, field, value, origins, {}, override_label(text))
    return _validate(SystemSpec, tree, origins)
