"""Tab completion of the command line, for shells set up with argcomplete (README.md).

argcomplete calls a completer with the word typed so far (``prefix``) and offers what it
returns. The completers here offer the names of the shipped library (scenarios, models,
systems, accelerators, schedules) and the dotted fields of a scenario for ``--set``. They
import nothing heavy until a completion is asked for, and argcomplete itself is optional:
without it the attributes they are stored in are never read.
"""

from __future__ import annotations

import os
from typing import Any, Callable

# how deep ``--set`` completion walks the scenario's nested fields: cluster.system.scale_out.nic_bandwidth
FIELD_DEPTH = 4


def _starting(prefix: str, words: list[str]) -> list[str]:
    return [word for word in dict.fromkeys(words) if word.startswith(prefix)]


def complete_scenario(prefix: str, **_: Any) -> list[str]:
    """Shipped scenarios by path, and YAML files and folders under the typed path."""
    from mpsim.specs.shipped import shipped_files

    words = [item.file for item in shipped_files("scenarios")]
    folder, _, start = prefix.rpartition(os.sep)
    try:
        entries = sorted(os.scandir(folder or "."), key=lambda entry: entry.name)
    except OSError:
        entries = []
    for entry in entries:
        if not entry.name.startswith(start) or entry.name.startswith("."):
            continue
        path = f"{folder}{os.sep}{entry.name}" if folder else entry.name
        if entry.is_dir():
            words.append(path + os.sep)
        elif entry.name.endswith((".yaml", ".yml")):
            words.append(path)
    return _starting(prefix, words)


def scenario_fields(depth: int = FIELD_DEPTH) -> list[str]:
    """Every dotted field a scenario has, down to ``depth`` levels (a field that may be one
    of several models, like ``model``, lists the fields of each)."""
    from pydantic import BaseModel

    from mpsim.specs.scenario import Scenario

    def models_of(annotation: Any) -> list[type[BaseModel]]:
        found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
        for inner in getattr(annotation, "__args__", ()):
            found += models_of(inner)
        return found

    def walk(models: list[type[BaseModel]], prefix: str, level: int) -> list[str]:
        fields: list[str] = []
        for model in models:
            for name, info in model.model_fields.items():
                fields.append(prefix + name)
                inner = models_of(info.annotation)
                if inner and level < depth:
                    fields += walk(inner, f"{prefix}{name}.", level + 1)
        return fields

    return list(dict.fromkeys(walk([Scenario], "", 1)))


def complete_scenario_field(prefix: str, **_: Any) -> list[str]:
    """``--set`` keys: ``parallel.`` offers ``parallel.tp=``, ``parallel.pp=``, ...; after the
    ``=``, nothing is guessed."""
    if "=" in prefix:
        return []
    return _starting(prefix, [f"{name}=" for name in scenario_fields()])


def names_completer(kind: str) -> Callable[..., list[str]]:
    """A completer offering the names of a kind of the library: ``model``, ``system``,
    ``accelerator`` or ``schedule``."""

    def complete(prefix: str, **_: Any) -> list[str]:
        if kind == "schedule":
            from mpsim.schedules import schedule_names

            return _starting(prefix, schedule_names())
        from mpsim.specs.loader import available

        return _starting(prefix, available(kind))

    return complete


def complete_schedules(prefix: str, **_: Any) -> list[str]:
    """``--schedules A,B,...``: the next name after the last comma."""
    from mpsim.schedules import schedule_names

    done, _, last = prefix.rpartition(",")
    head = f"{done}," if done else ""
    return [head + name for name in schedule_names() if name.startswith(last)]


def enable(parser: Any) -> None:
    """Answer the shell's completion request when argcomplete is installed (it exits the
    process after printing the candidates); otherwise do nothing."""
    if "_ARGCOMPLETE" not in os.environ:
        return  # not a completion request: skip even the import
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)
