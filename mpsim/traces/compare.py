"""A scenario's predicted step against profiler traces of the run it describes.

Each trace is one rank. Its pipeline rank comes from the stages its pass annotations
name (``PP:2F0`` runs on the rank the scenario's schedule puts stage 2 on) or, when they
name none, from ``distributedInfo``: global rank ``r`` is pipeline rank
``(r // stride) % pp`` with the stride of ``parallel.order`` (``tp-cp-ep-dp-pp`` puts
PP outermost, as Megatron-Core and torchtitan do); a trace whose world size is not the
scenario's device count, a stage the scenario does not have, or two traces of one
pipeline rank are input errors.

Two modes, chosen by what the traces hold:

- **passes**, when every trace annotates its microbatch passes (``passes.py``): each
  pass's measured time (median over the profiler steps) against the duration of the
  same action (stage, kind, microbatch) in the simulated timeline, per pass and per
  kind. The first stage's ``I`` and ``W`` of a microbatch are compared as one ``I+W``
  where the schedule splits the backward (PyTorch runs that stage's whole backward in
  its ``W``). An annotated pass the scenario's rank does not run is an input error.
- **categories** otherwise: the trace's GPU busy time per step by kernel category
  (``summary.py``; median over steps) against the simulated step's time in the same
  categories on that rank (``predicted.py``).

Both compare the step: the ``ProfilerStep`` span (per step the slowest rank, median
over steps) against the simulated step time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from mpsim.errors import InputError
from mpsim.schedules.actions import Action, Overlapped
from mpsim.simulate import SimulationResult
from mpsim.traces.model import CATEGORIES, Trace
from mpsim.traces.passes import MeasuredPass, measure_passes, stage_names
from mpsim.traces.predicted import item_kind, rank_categories
from mpsim.traces.summary import summarize


@dataclass(frozen=True)
class PassRow:
    """One pass of one rank: measured (median over steps) and predicted seconds."""

    rank: int
    label: str  # the action as mpsim and torch print it, or 0I+W3 for the first stage's merged backward
    kind: str  # F, B, I, W, I+W or F&B
    measured_s: float
    predicted_s: float
    steps: int  # profiler steps it was measured in

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else float("inf")


@dataclass(frozen=True)
class CategoryRow:
    """One kernel category on one rank, seconds per step."""

    rank: int
    category: str  # a trace category, or collective:KIND
    measured_s: float
    predicted_s: float

    @property
    def error_pct(self) -> float | None:
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else None


@dataclass
class TraceComparison:
    """Everything the report and the plot show."""

    mode: str  # "passes" or "categories"
    why: str
    result: SimulationResult
    traces: dict[int, Trace]  # pipeline rank -> its trace
    measured_step_s: float | None
    step_numbers: tuple[int, ...]  # the steps measured in every trace
    shown_step: int | None  # the step drawn: the one of median length
    passes: list[PassRow] = field(default_factory=list)
    categories: list[CategoryRow] = field(default_factory=list)
    measured: dict[int, list[MeasuredPass]] = field(default_factory=dict)  # pass mode: every measured pass
    notes: list[str] = field(default_factory=list)

    @property
    def predicted_step_s(self) -> float:
        return self.result.timeline.step_time_s

    @property
    def step_error_pct(self) -> float | None:
        if not self.measured_step_s:
            return None
        return 100.0 * (self.predicted_step_s - self.measured_step_s) / self.measured_step_s


def pipeline_ranks(traces: list[Trace], result: SimulationResult) -> dict[int, Trace]:
    """Each trace's pipeline rank in the scenario (input errors for traces that do not fit it)."""
    schedule, layout = result.schedule, result.layout
    accelerator = result.scenario.cluster.system.accelerator
    found: dict[int, Trace] = {}
    for trace in traces:
        if trace.device_name and not accelerator.matches_device("cuda", trace.device_name) \
                and not accelerator.matches_device("cpu", trace.device_name):
            # another part's kernels say nothing about this one's prediction
            raise InputError(f"the trace ran on {trace.device_name!r}, which the scenario's accelerator "
                             f"{accelerator.name} does not describe; compare it with a scenario on that device "
                             f"(--set cluster.system=... or cluster.system.accelerator=...)", trace.source)
        if trace.world_size is not None and trace.world_size != layout.devices:
            raise InputError(f"distributedInfo: a run of {trace.world_size} ranks, but the scenario runs on "
                             f"{layout.devices} devices (pp {layout.pp}); the traces must be of the run it describes",
                             trace.source)
        stages = stage_names(trace)
        if stages:
            beyond = sorted(s for s in stages if s >= schedule.num_stages)
            if beyond:
                raise InputError(f"its pass annotations name stage {beyond[0]}, but the scenario's pipeline has "
                                 f"{schedule.num_stages} stages over {schedule.num_ranks} ranks", trace.source)
            ranks = sorted({schedule.stage_to_rank[s] for s in stages})
            if len(ranks) > 1:
                raise InputError(f"its passes name stages {sorted(stages)}, which the scenario's {schedule.name} "
                                 f"schedule puts on pipeline ranks {ranks}; one trace is one rank", trace.source)
            rank = ranks[0]
        elif trace.rank is not None:
            rank = (trace.rank // layout.stride("pp")) % layout.pp
        else:
            raise InputError("no distributedInfo and no stage in its pass annotations: its pipeline rank is unknown",
                             trace.source)
        if rank in found:
            raise InputError(f"{found[rank].source} and {trace.source} are both pipeline rank {rank}; give one trace "
                             f"per pipeline rank", field="--trace")
        found[rank] = trace
    return dict(sorted(found.items()))


def _step_times(traces: dict[int, Trace]) -> tuple[float | None, tuple[int, ...], int | None]:
    """Median over the steps every trace has of the slowest rank's step, those steps, and the median one."""
    common = set.intersection(*({s.number for s in t.steps} for t in traces.values())) if traces else set()
    if not common:
        return None, (), None
    numbers = tuple(sorted(common))
    spans = {n: max(s.end_s - s.start_s for t in traces.values() for s in t.steps if s.number == n) for n in numbers}
    ordered = sorted(numbers, key=lambda n: (spans[n], n))
    return statistics.median(spans.values()), numbers, ordered[(len(ordered) - 1) // 2]


def _item_of(p: MeasuredPass, rank: int, stages_on_rank: list[int], trace: Trace):
    """The schedule item a measured pass stands for (the stage-less form gets the rank's one stage)."""
    if p.parsed.item is not None:
        return p.parsed.item
    if len(stages_on_rank) != 1:
        raise InputError(f"{p.name!r} names no stage, and pipeline rank {rank} holds stages {stages_on_rank} in the "
                         f"scenario: such annotations need one stage per rank", trace.source)
    return Action(stages_on_rank[0], p.parsed.kind, p.parsed.microbatch)


def _order_note(comparison: TraceComparison, rank: int, trace: Trace, stages_on_rank: list[int],
                simulated: list[str]) -> None:
    """A note when the rank ran its passes (in the step drawn) in another order than the scenario's schedule."""
    ran = [str(_item_of(p, rank, stages_on_rank, trace)) for p in comparison.measured[rank]
           if p.step == comparison.shown_step]
    expected = [key for key in simulated if key in set(ran)]
    if ran != expected:
        at = next(i for i, (a, b) in enumerate(zip(ran + [""], expected + [""])) if a != b)
        comparison.notes.append(f"rank {rank}: the trace runs its passes in another order than the scenario's "
                                f"{comparison.result.schedule.name} (position {at + 1}: "
                                f"{ran[at] if at < len(ran) else 'end'} where the schedule has "
                                f"{expected[at] if at < len(expected) else 'end'})")


def _pass_rows(comparison: TraceComparison) -> None:
    result = comparison.result
    schedule = result.schedule
    merge_first = schedule.split_backward
    for rank, trace in comparison.traces.items():
        stages_on_rank = [s for s, r in enumerate(schedule.stage_to_rank) if r == rank]
        records = {str(record.action): record for record in result.timeline.actions[rank]}
        measured: dict[str, dict[int, float]] = defaultdict(dict)
        for p in comparison.measured[rank]:
            key = str(_item_of(p, rank, stages_on_rank, trace))
            if key not in records:
                raise InputError(f"{p.name!r} in ProfilerStep#{p.step}: pipeline rank {rank} of the scenario runs no "
                                 f"{key} ({schedule.name}, {schedule.num_microbatches} microbatches, stages "
                                 f"{stages_on_rank} on this rank)", trace.source)
            measured[key][p.step] = measured[key].get(p.step, 0.0) + p.elapsed_s
        _order_note(comparison, rank, trace, stages_on_rank, list(records))
        missing = [key for key in records if key not in measured]
        if missing:
            comparison.notes.append(f"rank {rank}: {len(missing)} simulated passes not in the trace "
                                    f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''})")
        pending: dict[int, tuple[float, dict[int, float]]] = {}
        for record in result.timeline.actions[rank]:
            key = str(record.action)
            if key not in measured:
                continue
            predicted = record.end_s - record.start_s
            steps = measured[key]
            item = record.action
            if merge_first and not isinstance(item, Overlapped) and item.stage == 0 and item.kind in ("I", "W"):
                if item.kind == "I":
                    pending[item.microbatch] = (predicted, steps)
                    continue
                if item.microbatch in pending:
                    p_i, s_i = pending.pop(item.microbatch)
                    both = {n: s_i[n] + steps[n] for n in steps if n in s_i}
                    if both:
                        comparison.passes.append(PassRow(rank, f"0I+W{item.microbatch}", "I+W",
                                                         statistics.median(both.values()), p_i + predicted, len(both)))
                    continue
            comparison.passes.append(PassRow(rank, key, item_kind(item), statistics.median(steps.values()), predicted,
                                             len(steps)))


def _category_rows(comparison: TraceComparison) -> None:
    predicted = rank_categories(comparison.result)
    for rank, trace in comparison.traces.items():
        windows = summarize(trace).windows
        measured: dict[str, float] = {}
        for category in CATEGORIES:
            if category != "collective":
                measured[category] = statistics.median(w.category_s[category] for w in windows)
        kinds = sorted({kind for w in windows for kind in w.collective_kind_s})
        for kind in kinds:
            measured[f"collective:{kind}"] = statistics.median(w.collective_kind_s.get(kind, 0.0) for w in windows)
        names = [c for c in CATEGORIES if c != "collective"] + sorted(
            {k for k in measured if k.startswith("collective:")} | {k for k in predicted[rank]
                                                                    if k.startswith("collective:")})
        for name in names:
            m, p = measured.get(name, 0.0), predicted[rank].get(name, 0.0)
            if m > 0 or p > 0:
                comparison.categories.append(CategoryRow(rank, name, m, p))


def compare_traces(traces: list[Trace], result: SimulationResult) -> TraceComparison:
    """Line up ``traces`` (one per pipeline rank, any subset of the ranks) with the simulated step."""
    ranked = pipeline_ranks(traces, result)
    measured = {rank: measure_passes(trace) for rank, trace in ranked.items()}
    step_s, numbers, shown = _step_times(ranked)
    unannotated = [trace.source for rank, trace in ranked.items() if not measured[rank]]
    if not unannotated:
        forms = sorted({"'Forward i' / 'Backward i'" if p.parsed.item is None else "'PP:<action>'"
                        for passes in measured.values() for p in passes})
        comparison = TraceComparison("passes", f"every trace annotates its microbatch passes ({' and '.join(forms)} "
                                     f"inside ProfilerStep ranges)", result, ranked, step_s, numbers, shown,
                                     measured=measured)
        _pass_rows(comparison)
        if not ranked or all(not trace.kernels for trace in ranked.values()):
            comparison.notes.append("CPU-only traces: a pass is its annotation's span less the wait for its input")
        return comparison
    for trace in ranked.values():
        if not trace.kernels:
            raise InputError("no GPU kernels and no microbatch pass annotations inside a ProfilerStep: nothing to "
                             "compare", trace.source)
    why = (f"no microbatch pass annotations in {unannotated[0]}" + (f" and {len(unannotated) - 1} more"
                                                                    if len(unannotated) > 1 else "")
           + " (PyTorch's Schedule1F1B and Megatron-Core write none)")
    comparison = TraceComparison("categories", why, result, ranked, step_s, numbers, shown)
    _category_rows(comparison)
    return comparison


def kind_summary(rows: list[PassRow]) -> list[tuple[str, int, float, float, float, float]]:
    """Per kind: (kind, passes, measured s per step, predicted s per step, median error %, max |error| %)."""
    by_kind: dict[str, list[PassRow]] = defaultdict(list)
    for row in rows:
        by_kind[row.kind].append(row)
    order = ["F", "B", "I", "W", "I+W", "F&B"]
    out = []
    for kind in sorted(by_kind, key=lambda k: (order.index(k) if k in order else len(order), k)):
        group = by_kind[kind]
        errors = [row.error_pct for row in group]
        out.append((kind, len(group), sum(r.measured_s for r in group), sum(r.predicted_s for r in group),
                    statistics.median(errors), max(abs(e) for e in errors)))
    return out
