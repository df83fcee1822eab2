"""Many simulations at once: schedules side by side, sweeps and the layout planner.

``compare`` simulates one scenario under several schedules as ``mpsim compare`` does;
``sweep`` and ``plan`` call the explore layer's ``run_sweep`` and ``plan`` (what
``mpsim sweep`` and ``mpsim plan`` call) and keep every record for a data frame.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mpsim.api.result import Result, dataframe, writable_path, writing
from mpsim.api.scenarios import loaded_scenario, override_texts, plain_value, simulate, source_of
from mpsim.errors import InputError

if TYPE_CHECKING:
    from mpsim.specs import Scenario


class Comparison:
    """One scenario under several schedules (``mpsim compare``): ``results`` maps each schedule
    to its :class:`Result`, ``errors`` each one that cannot run to why."""

    def __init__(self, results: dict[str, Result], errors: dict[str, str]):
        self.results = results
        self.errors = errors

    def plot(self, path: str | os.PathLike) -> None:
        """The timelines one above the other, as ``mpsim compare --plot`` draws them."""
        from mpsim.results.plot import plot_timelines

        panels = [(r.simulation, r.summary, f"{name} (vpp {r.summary.vpp})") for name, r in self.results.items()]
        if not panels:
            raise InputError("no schedule could run, so there is nothing to draw", field="plot(path)")
        target = writable_path("plot", path, picture=True)
        with writing("plot"):
            plot_timelines(panels, target, [r.reference for r in self.results.values()])

    def to_dataframe(self) -> Any:
        """One row per schedule that ran: the summary's numbers (needs pandas)."""
        return dataframe([{key: value for key, value in r.to_dict().items() if not isinstance(value, list)}
                           for r in self.results.values()])

    def __repr__(self) -> str:
        from mpsim.units import format_bytes, format_seconds

        lines = []
        for name, r in self.results.items():
            s = r.summary
            lines.append(f"{name:<18} vpp {s.vpp}  step {format_seconds(s.step_time_s):>10}  bubble "
                         f"{100 * s.bubble_fraction:5.1f} %  MFU {100 * s.mfu:5.1f} %  peak "
                         f"{format_bytes(s.peak_memory_bytes)}{'  OUT OF MEMORY' if s.out_of_memory else ''}")
        lines += [f"{name:<18} cannot run: {error}" for name, error in self.errors.items()]
        return "\n".join(lines)


def _schedule_names(schedules: Sequence[str], allow_none: bool = False) -> list[str]:
    """Registered schedule names, each known; a typo is an error, not a shorter list."""
    from mpsim.schedules import canonical_name, unknown_schedule

    if isinstance(schedules, str) or not all(isinstance(name, str) for name in schedules):
        raise InputError("expected a list of schedule names like ['1f1b', 'zb-h1']", field="schedules")
    if not schedules and not allow_none:
        raise InputError("no schedule named; e.g. ['1f1b', 'interleaved-1f1b']", field="schedules")
    for name in schedules:
        problem = unknown_schedule(name)
        if problem:
            raise InputError(problem, field="schedules")
    return [canonical_name(name) for name in schedules]


def compare(scenario: str | os.PathLike | Scenario, schedules: Sequence[str],
            overrides: Mapping[str, Any] | Sequence[str] | None = None) -> Comparison:
    """Simulate the scenario under each schedule, with the chunks per rank ``mpsim compare`` gives it
    (the scenario's own when the schedule allows them, else what the schedule needs)."""
    base = loaded_scenario(scenario, overrides)
    results: dict[str, Result] = {}
    errors: dict[str, str] = {}
    from mpsim.schedules import chunks_per_rank

    for canonical in _schedule_names(schedules):
        vpp = chunks_per_rank(canonical, base.scenario.parallel.vpp)
        try:
            results[canonical] = simulate(base.scenario, [f"parallel.schedule={canonical}", f"parallel.vpp={vpp}"])
        except InputError as exc:
            errors[canonical] = str(exc)
    if not results:
        first = next(iter(errors.values()))
        raise InputError(f"no schedule could run: {first}")
    return Comparison(results, errors)


def _axis_text(name: Any, values: Any) -> str:
    """``{"parallel.tp": [1, 2, 4]}`` entry -> ``parallel.tp=1,2,4``; a text value (``"2^0..3"``) as written."""
    from mpsim.explore.axes import override_text

    if not isinstance(name, str) or "=" in name:
        raise InputError(f"a swept field must be a dotted name like 'parallel.tp', got {name!r}", field="axes")
    if isinstance(values, str):
        return f"{name}={values}"
    if not isinstance(values, (list, tuple, range)) or not values:
        raise InputError(f"expected a non-empty list of values or a range text like '2^0..3', got {values!r}",
                         field=name)
    return f"{name}=" + ",".join(override_text(name, plain_value(v)).split("=", 1)[1] for v in values)


class Exploration:
    """The records of a sweep or a plan: one per point, in point order (None where not reached)."""

    def __init__(self, outcome: Any, records: list[dict | None], text: str, ranking: list[dict] | None = None):
        self.outcome = outcome  # the explore layer's SweepResult or PlanResult
        self.records = records
        self._text = text
        self._ranking = ranking  # a plan's winners, best first

    def to_dataframe(self) -> Any:
        """One row per point reached: its fields, status, error and metrics (needs pandas). A
        plan's rows carry their ``rank`` (1 for the best; none for layouts that did not rank) and
        come best first, then the others in the order they were enumerated."""
        def row(r: dict) -> dict:
            return {**dict(r["point"]), "status": r["status"], "error": r.get("error"), **(r.get("metrics") or {})}

        reached = [r for r in self.records if r is not None]
        if self._ranking is None:
            return dataframe([row(r) for r in reached])
        position = {id(r): i for i, r in enumerate(self._ranking, 1)}
        ordered = list(self._ranking) + [r for r in reached if id(r) not in position]
        frame = dataframe([{"rank": position.get(id(r)), **row(r)} for r in ordered])
        frame["rank"] = frame["rank"].astype("Int64")  # whole numbers, empty where a layout did not rank
        return frame

    def __repr__(self) -> str:
        return self._text


def sweep(scenario: str | os.PathLike | Scenario, axes: Mapping[str, Any] | None = None, *,
          zipped: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None,
          engine: str = "fast", workers: int | None = None, out: str | os.PathLike | None = None) -> Exploration:
    """``mpsim sweep``: every combination of ``axes`` (``{"parallel.tp": [1, 2, 4]}``), the fields of
    ``zipped`` varying together as one more axis, plus the file's own ``sweep:`` block."""
    from mpsim.explore.sweep import format_sweep, run_sweep

    if isinstance(scenario, (str, os.PathLike)):
        name, texts = os.fspath(scenario), override_texts(overrides)
    else:
        loaded = loaded_scenario(scenario, overrides)  # a scenario from load: its file and its overrides
        source = source_of(loaded.scenario)
        if source is None:
            raise InputError("a sweep reads the scenario's file: pass its path or name, or a scenario returned "
                             "by mpsim.load", field="scenario")
        name, texts = source.file, list(source.overrides)
    for label, given in (("axes", axes), ("zipped", zipped)):
        if given is not None and not isinstance(given, Mapping):
            raise InputError(f"expected a dict {{field: values}}, got {type(given).__name__}", field=label)
    grid = [_axis_text(field, values) for field, values in (axes or {}).items()]
    zip_ = [_axis_text(field, values) for field, values in (zipped or {}).items()]
    result = run_sweep(name, grid, zip_, texts, engine=engine, workers=workers,
                       out=None if out is None else writable_path("sweep", out, argument="out"), progress=False)
    return Exploration(result, result.report.records, format_sweep(result))


def plan(model: str | os.PathLike, *, cluster: str | os.PathLike, devices: int, global_batch: int,
         seq: int | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None, top: int = 10,
         schedules: Sequence[str] = (), engine: str = "fast", workers: int | None = None, **options: Any
         ) -> Exploration:
    """``mpsim plan``: the fastest layouts of a model on a cluster that fit. ``options`` are the
    planner's own (``max_microbatch_size``, ``max_vpp``, ``max_cp``, ``zero_stages``, ``prune``)."""
    from mpsim.explore.planbase import base_scenario
    from mpsim.explore.planner import plan as run_plan
    from mpsim.explore.planreport import format_plan, ranked
    from mpsim.specs.loader import parse_override

    allowed = {"max_microbatch_size", "max_vpp", "max_cp", "zero_stages", "prune"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InputError(f"unknown option {unknown[0]!r}; the planner takes {', '.join(sorted(allowed))}",
                         field="plan")
    for label, count in (("devices", devices), ("global_batch", global_batch), ("top", top)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(f"must be a whole number of 1 or more, got {count!r}", field=label)
    for label, given in (("model", model), ("cluster", cluster)):
        if not isinstance(given, (str, os.PathLike)):
            raise InputError(f"expected a file or a shipped name, got {type(given).__name__}", field=label)
    texts = override_texts(overrides)
    scenario = base_scenario(os.fspath(model), os.fspath(cluster), devices, global_batch, seq, texts)
    pinned = [".".join(parse_override(text)[0]) for text in texts]  # fields set are not enumerated
    names = _schedule_names(schedules, allow_none=True)
    result = run_plan(scenario, top=top, pinned=pinned, schedules=names, engine=engine, workers=workers,
                      progress=False, **options)
    return Exploration(result, result.records, format_plan(result, top), ranking=ranked(result))
