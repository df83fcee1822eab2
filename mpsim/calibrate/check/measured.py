"""The measured side of a validation: steps of a real PyTorch pipeline, as plain data.

The workers report, per rank and kept step, the step's start mark and every action as
``[stage, kind, microbatch, start_s, end_s]`` on the machine's shared monotonic clock,
plus the intervals the rank spent blocked in a receive. Here they become
:class:`MeasuredStep` objects with times relative to the step's start, the loss (kind
``L``, which PyTorch runs right after the last stage's forward) merged into that
forward the way mpsim counts it, and the helpers that line measured actions up with an
mpsim schedule's items.

A measured step lasts from the earliest rank's start of ``schedule.step()`` to the end
of the last action on any rank: the pipeline, the part of a step mpsim's timeline
covers (the validation job runs no optimizer).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from mpsim.schedules.actions import parts


@dataclass(frozen=True)
class MeasuredAction:
    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.stage, self.kind, self.microbatch)


@dataclass
class MeasuredStep:
    """One step of one schedule, every rank, times relative to the step's start."""

    actions: list[list[MeasuredAction]]  # per rank, in execution order
    waits: list[list[tuple[float, float]]]  # per rank: blocked in a receive
    foreign_cpu_share: float = 0.0
    slowdown: float = 1.0  # the speed canary's, worst of before and after the step
    disturbed: bool = False  # kept although every try was disturbed (--allow-busy): the least disturbed one
    by_key: list[dict[tuple[int, str, int], MeasuredAction]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_key = [{a.key: a for a in rank} for rank in self.actions]

    @property
    def step_s(self) -> float:
        return max((rank[-1].end_s for rank in self.actions if rank), default=0.0)


def _merge_loss(actions: list[list]) -> list[list]:
    """Fold each loss record into the forward of the same stage and microbatch that precedes it."""
    merged: list[list] = []
    for record in actions:
        stage, kind, mb, start, end = record
        if kind == "L":
            for previous in reversed(merged):
                if previous[0] == stage and previous[1] == "F" and previous[2] == mb:
                    previous[4] = max(previous[4], end)
                    break
            continue
        merged.append(list(record))
    return merged


def parse_steps(per_rank: list[dict]) -> list[MeasuredStep]:
    """The kept steps of one schedule from each rank's report (ranks agree on which were kept)."""
    counts = {len(report["steps"]) for report in per_rank}
    if len(counts) != 1:
        raise ValueError(f"ranks kept different numbers of steps: {sorted(counts)}")
    steps = []
    for index in range(counts.pop()):
        raw = [report["steps"][index] for report in per_rank]
        origin = min(r["start_s"] for r in raw)
        actions = [[MeasuredAction(s, k, mb, start - origin, end - origin)
                     for s, k, mb, start, end in _merge_loss(r["actions"])] for r in raw]
        waits = [[(a - origin, b - origin) for a, b in r["waits"]] for r in raw]
        share = max(r.get("foreign_cpu_share", 0.0) for r in raw)
        steps.append(MeasuredStep(actions, waits, share, max(r.get("slowdown", 1.0) for r in raw),
                                  any(r.get("disturbed", False) for r in raw)))
    return steps


def item_duration(step: MeasuredStep, rank: int, item) -> float | None:
    """Measured seconds of an mpsim schedule item (an overlapped pair: both halves, run one after the other)."""
    total = 0.0
    for action in parts(item):
        found = step.by_key[rank].get(tuple(action))
        if found is None:
            return None
        total += found.duration_s
    return total


def median_step(steps: list[MeasuredStep]) -> MeasuredStep:
    """The step whose duration is the median (the lower one for an even count)."""
    ordered = sorted(steps, key=lambda s: s.step_s)
    return ordered[(len(ordered) - 1) // 2]


def framework_gaps(steps: list[MeasuredStep]) -> list[float]:
    """Time between consecutive actions on a rank that was not spent blocked in a receive."""
    gaps = []
    for step in steps:
        for rank, actions in enumerate(step.actions):
            for before, after in zip(actions, actions[1:]):
                blocked = sum(max(0.0, min(b, after.start_s) - max(a, before.end_s)) for a, b in step.waits[rank])
                gaps.append(max(0.0, after.start_s - before.end_s - blocked))
    return gaps


def order_mismatch(step: MeasuredStep, schedule) -> str | None:
    """Where the executed order differs from mpsim's schedule, or None when it is the same."""
    for rank, items in enumerate(schedule.actions):
        expected = [tuple(a) for item in items for a in parts(item)]
        ran = [a.key for a in step.actions[rank]]
        if ran != expected:
            index = next((i for i, (x, y) in enumerate(zip(ran, expected)) if x != y), min(len(ran), len(expected)))
            got = ran[index] if index < len(ran) else "nothing"
            want = expected[index] if index < len(expected) else "nothing"
            return f"rank {rank} action {index}: ran {got}, mpsim expects {want}"
    return None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
