"""The planner's starting point: a scenario built from a model, a system and a device count.

``base_scenario`` assembles the scenario tree ``mpsim plan`` describes on its command
line and runs it through the loader's steps (references by name or path, ``--set``
overrides, validation), so its errors read like any scenario's. ``apply_fields`` makes
the copy for one layout, validating only the sections a layout touches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from mpsim.errors import InputError
from mpsim.specs.loader import override_label, Origins, apply_override, parse_override, resolve_references, validation_error
from mpsim.specs.scenario import Scenario


def base_scenario(model: str, system: str, devices: int, global_batch_size: int, seq_length: int | None = None,
                  overrides: Sequence[str] = ()) -> Scenario:
    """The scenario every layout starts from: model and cluster by name or path, defaults elsewhere."""
    if devices <= 0:
        raise InputError("must be a positive number of devices", "--devices")
    if global_batch_size <= 0:
        raise InputError("must be a positive number of sequences", "--global-batch")
    tree: dict[str, Any] = {
        "name": f"{model} on {devices} x {system}",
        "cluster": {"system": system, "num_devices": devices},
        "model": model,
        "parallel": {"global_batch_size": global_batch_size},
    }
    origins = Origins({(): "plan", ("model",): "MODEL", ("cluster", "system"): "--cluster"})
    base_dirs = {(): Path.cwd()}
    settings = [(parse_override(text), override_label(text)) for text in overrides]
    if seq_length is not None:
        settings.append(((("model", "seq_length"), seq_length), "--seq"))
    for (field_path, value), label in settings:
        apply_override(tree, field_path, value, origins, base_dirs, label)
    resolve_references(tree, origins, base_dirs)
    try:
        return Scenario.model_validate(tree)
    except ValidationError as exc:
        raise validation_error(exc, origins) from None


def apply_fields(scenario: Scenario, fields: dict[str, Any]) -> Scenario:
    """A copy of ``scenario`` with dotted fields replaced, each touched section validated again."""
    sections: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        top, _, rest = name.partition(".")
        if not rest:
            raise InputError("the planner sets fields inside a section, like parallel.tp", name)
        sections.setdefault(top, {})[rest] = value
    update = {}
    for top, changes in sections.items():
        current = getattr(scenario, top)
        data = current.model_dump()
        for rest, value in changes.items():
            node = data
            *parents, leaf = rest.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        try:
            update[top] = type(current).model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join([top, *(str(p) for p in error["loc"])])
            raise InputError(error["msg"].removeprefix("Value error, "), field=where) from None
    return scenario.model_copy(update=update)
