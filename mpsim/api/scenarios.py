"""Scenarios for the interface: read by path or name with overrides, remembered, simulated.

``load`` returns the validated pydantic scenario. So that it can later be simulated,
varied or swept exactly as its file would be (a schedule file beside it, errors named
in it), each loaded scenario is remembered with the file and overrides it came from;
``simulate`` runs what ``mpsim run`` runs and hands back a :class:`~mpsim.api.result.Result`.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mpsim.api.result import Result
from mpsim.errors import InputError

if TYPE_CHECKING:
    from mpsim.specs import LoadedScenario, Scenario


def override_texts(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """Overrides as the ``--set FIELD=VALUE`` texts the loader reads.

    A dict maps dotted fields to Python values (written back as the YAML that reads as
    the same value, the way a sweep writes its points); a list holds the texts as typed
    after ``--set``.
    """
    from mpsim.explore.axes import override_text

    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        texts = []
        for name, value in overrides.items():
            if not isinstance(name, str) or not name.strip() or "=" in name:
                raise InputError(f"a field must be a dotted name like 'parallel.tp', got {name!r}", field="overrides")
            texts.append(override_text(name.strip(), plain_value(value)))
        return texts
    if isinstance(overrides, (list, tuple)):
        for text in overrides:
            if not isinstance(text, str):
                raise InputError(f"expected 'field=value' texts like 'parallel.tp=4', got {text!r}", field="overrides")
        return list(overrides)
    # a lone string would be read character by character: refuse it rather than guess
    raise InputError(f"expected a dict {{field: value}} or a list of 'field=value' texts, got "
                     f"{type(overrides).__name__}", field="overrides")


def plain_value(value: Any) -> Any:
    """numpy's integers and floats as Python's (lossless), so they are written as numbers."""
    import numbers

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


@dataclass(frozen=True)
class Source:
    """Where a scenario returned by :func:`load` came from, so it can be simulated or varied later
    exactly as its file would be (relative schedule files, errors located in the file)."""

    reference: weakref.ref  # the scenario itself, not kept alive by this record
    file: str  # the scenario file, as an absolute path (a later change of folder reads the same file)
    overrides: tuple[str, ...]
    origins: Any  # the loader's Origins: which file or override each field came from


# id of a loaded Scenario -> its source; entries leave with their scenario (the models are
# frozen and hold no field for this)
SOURCES: dict[int, Source] = {}


def _remember(overrides: list[str], loaded: LoadedScenario) -> None:
    key = id(loaded.scenario)
    file = str(loaded.path.resolve())
    SOURCES[key] = Source(weakref.ref(loaded.scenario), file, tuple(overrides), loaded.origins)
    weakref.finalize(loaded.scenario, SOURCES.pop, key, None)


def source_of(scenario: Any) -> Source | None:
    """The source of a scenario :func:`load` returned, or None for any other object."""
    source = SOURCES.get(id(scenario))
    return source if source is not None and source.reference() is scenario else None


def loaded_scenario(scenario: Any, overrides: Mapping[str, Any] | Sequence[str] | None) -> LoadedScenario:
    """A scenario with its origins: read from a path or name, or the one :func:`load` returned."""
    from pathlib import Path

    from mpsim.specs import LoadedScenario, Scenario
    from mpsim.specs.loader import Origins

    texts = override_texts(overrides)
    if isinstance(scenario, Scenario):
        source = source_of(scenario)
        if source is None and texts:
            raise InputError("apply to a scenario file: pass its path or name, or a scenario returned by "
                             "mpsim.load", field="overrides")
        if source is None:
            return LoadedScenario(scenario, Origins())
        if not texts:
            return LoadedScenario(scenario, source.origins, Path(source.file))
        return _read(source.file, [*source.overrides, *texts])
    if isinstance(scenario, (str, os.PathLike)):
        return _read(os.fspath(scenario), texts)
    raise InputError(f"expected a scenario file, the name of a shipped scenario or a scenario from mpsim.load, "
                     f"got {type(scenario).__name__}", field="scenario")


def _read(name: str, texts: list[str]) -> LoadedScenario:
    from mpsim.specs import load_scenario

    loaded = load_scenario(name, texts)
    _remember(texts, loaded)
    return loaded


def load(scenario: str | os.PathLike | Scenario, overrides: Mapping[str, Any] | Sequence[str] | None = None
         ) -> Scenario:
    """The validated scenario (pydantic) of a file or a shipped scenario's name, with overrides.

    ``overrides`` is a dict ``{"parallel.tp": 4}`` or a list ``["parallel.tp=4"]``, read the
    way ``mpsim run --set`` reads them. Bad input raises :class:`mpsim.errors.InputError`.
    """
    return loaded_scenario(scenario, overrides).scenario


def simulate(scenario: str | os.PathLike | Scenario, overrides: Mapping[str, Any] | Sequence[str] | None = None
             ) -> Result:
    """Simulate one training step the way ``mpsim run`` does and return its :class:`Result`."""
    from mpsim.results import summarize
    from mpsim.results.report import placement_warning
    from mpsim.simulate import bubble_reference, simulate as simulate_step

    loaded = loaded_scenario(scenario, overrides)
    try:
        simulation = simulate_step(loaded.scenario, loaded.path.parent if loaded.path else None)
    except InputError as exc:
        raise loaded.origins.locate(exc) from None
    reference = bubble_reference(simulation)
    warning = placement_warning(simulation.layout, simulation.scenario.cluster.system)
    return Result(simulation, reference, summarize(simulation, reference), warning)
