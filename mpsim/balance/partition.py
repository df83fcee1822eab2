"""Contiguous partition of a layer sequence into pipeline stages: the slowest stage as fast as possible.

A pipeline runs at the pace of its slowest stage: in steady state every stage handles
one microbatch per beat, and the beat is the longest stage time. Given each unit's
seconds per microbatch (forward + backward), the seconds to send its output to the next
stage if the pipeline is cut after it, and its memory (model state, plus activations
times the microbatches the schedule keeps in flight on that stage), the partition
chooses ``parts`` contiguous runs of units minimizing the largest stage time, subject to
every stage fitting its memory budget.

The exact optimum comes from dynamic programming over (stage, last unit): the best
bottleneck of covering units ``[0, b)`` with ``i + 1`` stages is the minimum over the
previous cut ``a`` of ``max(best[i][a], time of stage i on [a, b))``. For a fixed end
``b`` a stage's time and memory only grow as it starts earlier (costs are non-negative
and the boundary term depends on ``b`` alone), so the scan over ``a`` stops at the first
start that is already worse than the best found or over budget. This is the classic
linear-partition problem (e.g. Narayanan et al. 2019, PipeDream's planner, solve a
richer variant the same way); ``exhaustive`` enumerates every split for tests. Under
``recompute_num_layers`` a stage's first layers recompute and the rest do not, so a
unit's cost depends on where its stage starts; where recomputing one unit can cost more
than another unit's passes, an earlier start can be faster and the scan goes on to the
first unit.

The per-stage bound counts each stage's microbatches in flight and weight gradients
waiting at their own peaks. :func:`rank_peak_bytes` is the tighter check of a split
found: it walks one rank's passes in their order, so chunks of one rank, and the two
peaks of one stage, are added only where they meet.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionProblem:
    """Per-unit costs and per-stage constants of one pipeline split."""

    unit_s: tuple[float, ...]  # seconds per microbatch of each unit (forward + backward)
    parts: int
    boundary_s: tuple[float, ...] = ()  # seconds to pass unit i's output on when a stage ends after it
    unit_state_bytes: tuple[float, ...] = ()  # weights, gradients and optimizer state of each unit
    unit_activation_bytes: tuple[float, ...] = ()  # kept per microbatch in flight
    extra_s: tuple[float, ...] = ()  # fixed seconds of each stage (a transformer's embedding, head)
    extra_bytes: tuple[float, ...] = ()  # fixed state bytes of each stage (its embedding's, its head's)
    in_flight: tuple[int, ...] = ()  # microbatches each stage holds at its peak
    # split backwards (zero-bubble schedules): what each unit's input-gradient pass keeps for its
    # weight-gradient pass, and the most such passes each stage has waiting at once
    unit_weight_grad_bytes: tuple[float, ...] = ()
    pending_weight_grads: tuple[int, ...] = ()
    capacity_bytes: float = math.inf  # budget of each stage
    # on a heterogeneous or degraded cluster: how many times slower each stage's device runs the
    # same work, and each stage's own budget (docs/heterogeneous.md); empty: 1 and capacity_bytes
    stage_slowdown: tuple[float, ...] = ()
    stage_capacity_bytes: tuple[float, ...] = ()
    # what the fixed work of each stage keeps per microbatch in flight, and per weight gradient waiting
    extra_activation_bytes: tuple[float, ...] = ()
    extra_weight_grad_bytes: tuple[float, ...] = ()
    # parallel.recompute_num_layers: the first ``recomputed_layers`` layer units of each stage recompute
    # (as unit_s and unit_activation_bytes price them), the others keep their activations
    # (``kept_unit_s``, ``kept_unit_activation_bytes``); ``unit_is_layer`` says which units count
    # (empty: all). None: every unit as unit_s prices it
    recomputed_layers: int | None = None
    kept_unit_s: tuple[float, ...] = ()
    kept_unit_activation_bytes: tuple[float, ...] = ()
    unit_is_layer: tuple[bool, ...] = ()

    def capacity_of(self, stage: int) -> float:
        """The memory budget of ``stage``."""
        return self.stage_capacity_bytes[stage] if self.stage_capacity_bytes else self.capacity_bytes

    def recompute_ends(self) -> list[int]:
        """For each unit ``a``, where a stage starting at ``a`` stops recomputing: just after its
        ``recomputed_layers``-th layer unit (the number of units if it has fewer)."""
        n = len(self.unit_s)
        if self.recomputed_layers is None:
            return [n] * n
        ends = []
        for a in range(n):
            end, left = a, self.recomputed_layers
            while end < n and left > 0:
                left -= 1 if not self.unit_is_layer or self.unit_is_layer[end] else 0
                end += 1
            ends.append(end)
        return ends

    def _get(self, values: tuple, index: int, default: float = 0.0) -> float:
        return values[index] if values else default


class Prefix:
    """Prefix sums for O(1) range costs."""

    def __init__(self, values: tuple[float, ...] | list[float], n: int):
        self.sums = [0.0]
        for i in range(n):
            self.sums.append(self.sums[-1] + (values[i] if values else 0.0))

    def range(self, a: int, b: int) -> float:
        return self.sums[b] - self.sums[a]


class UnitSeconds:
    """Seconds of units ``[a, b)`` in O(1) (prefix sums): the units a stage recomputes at
    ``unit_s``, the rest at ``kept_unit_s`` (``PartitionProblem.recomputed_layers``)."""

    def __init__(self, problem: PartitionProblem):
        n = len(problem.unit_s)
        self.recomputed = Prefix(problem.unit_s, n)
        self.kept = Prefix(problem.kept_unit_s, n) if problem.recomputed_layers is not None else self.recomputed
        self.ends = problem.recompute_ends()

    def range(self, a: int, b: int) -> float:
        if a == b:
            return 0.0
        end = min(self.ends[a], b)
        return self.recomputed.range(a, end) + self.kept.range(end, b)


def stage_time_s(problem: PartitionProblem, stage: int, a: int, b: int, times: UnitSeconds | None = None) -> float:
    """Seconds of ``stage`` holding units ``[a, b)``: its units, its fixed work, the send after it."""
    n = len(problem.unit_s)
    work = (times or UnitSeconds(problem)).range(a, b)
    send = problem._get(problem.boundary_s, b - 1) if stage < problem.parts - 1 and 0 < b < n else 0.0
    if problem.stage_slowdown:
        return (work + problem._get(problem.extra_s, stage)) * problem.stage_slowdown[stage] + send
    return work + problem._get(problem.extra_s, stage) + send


def stage_bytes(problem: PartitionProblem, stage: int, held: float, kept: float, waiting: float = 0.0) -> float:
    """Peak bytes of ``stage`` holding units whose state adds up to ``held``, activations to ``kept``
    and what an input-gradient pass keeps for its weight-gradient pass to ``waiting``: each at its
    own peak, a bound of the stage's peak."""
    flight = problem.in_flight[stage] if problem.in_flight else 1
    pending = problem.pending_weight_grads[stage] if problem.pending_weight_grads else 0
    return (held + problem._get(problem.extra_bytes, stage)
            + flight * (kept + problem._get(problem.extra_activation_bytes, stage))
            + pending * (waiting + problem._get(problem.extra_weight_grad_bytes, stage)))


def units_bytes(values: tuple[float, ...], a: int, b: int) -> float:
    """Bytes of units ``[a, b)``, added from the last unit to the first: the order in which
    :func:`balance` grows a stage, so that the search and :func:`fits` add each stage's
    bytes alike (a prefix difference can round one unit in the last place away from the
    sum, and a stage exactly at its budget would fit by one count and not by the other)."""
    total = 0.0
    for value in reversed(values[a:b]):
        total += value
    return total


def counts_to_cuts(counts: tuple[int, ...] | list[int]) -> list[tuple[int, int]]:
    """Units per stage -> (start, end) of each stage."""
    cuts, start = [], 0
    for count in counts:
        cuts.append((start, start + count))
        start += count
    return cuts


def bottleneck_s(problem: PartitionProblem, counts: tuple[int, ...] | list[int]) -> float:
    """The slowest stage's seconds for a split given as units per stage."""
    times = UnitSeconds(problem)
    return max(stage_time_s(problem, i, a, b, times) for i, (a, b) in enumerate(counts_to_cuts(counts)))


def stage_sums(problem: PartitionProblem, counts: tuple[int, ...] | list[int], fixed: bool = False
               ) -> list[tuple[float, float, float]]:
    """(state, activations per microbatch, weight-gradient inputs per waiting pass) of each
    stage's units under the split; ``fixed``: with the stage's fixed bytes of each kind."""
    sums, ends = [], problem.recompute_ends()
    for stage, (a, b) in enumerate(counts_to_cuts(counts)):
        extra = (problem._get(problem.extra_bytes, stage), problem._get(problem.extra_activation_bytes, stage),
                 problem._get(problem.extra_weight_grad_bytes, stage)) if fixed else (0.0, 0.0, 0.0)
        sums.append((units_bytes(problem.unit_state_bytes, a, b) + extra[0],
                     activation_bytes(problem, a, b, min(ends[a], b) if a < b else b) + extra[1],
                     units_bytes(problem.unit_weight_grad_bytes, a, b) + extra[2]))
    return sums


def activation_bytes(problem: PartitionProblem, a: int, b: int, end: int, kept_tail: float | None = None) -> float:
    """Activations per microbatch of units ``[a, b)`` that recompute up to ``end``: the kept units'
    added from the last (``kept_tail``, where the caller has that sum), then the recomputed ones'."""
    if problem.recomputed_layers is None:
        return units_bytes(problem.unit_activation_bytes, a, b)
    tail = units_bytes(problem.kept_unit_activation_bytes, end, b) if kept_tail is None else kept_tail
    return tail + units_bytes(problem.unit_activation_bytes, a, end)


def fits(problem: PartitionProblem, counts: tuple[int, ...] | list[int]) -> bool:
    """Whether every stage of the split is within the memory budget."""
    return all(stage_bytes(problem, i, *sums) <= problem.capacity_of(i)
               for i, sums in enumerate(stage_sums(problem, counts)))


# A pipeline rank's passes in the order it runs them: (stage, kind), the kind F (forward), B (whole
# backward), I (input gradient) or W (weight gradient)
RankPasses = tuple[tuple[int, str], ...]


def rank_peak_bytes(problem: PartitionProblem, counts: tuple[int, ...] | list[int], passes: RankPasses) -> float:
    """Peak bytes of a pipeline rank that runs ``passes`` under the split ``counts``.

    Its stages' state and fixed bytes, plus the most that its passes hold at once: a forward
    keeps its stage's activations until the backward (or the input gradient, which keeps
    what the weight gradient needs until that runs). Where a rank holds several chunks
    this walk lets one chunk use what the others leave free at that moment, which the
    per-stage bound of :func:`stage_bytes` cannot; for one chunk it is at most that bound.
    """
    sums = stage_sums(problem, counts, fixed=True)
    change = {"F": lambda s: sums[s][1], "B": lambda s: -sums[s][1], "I": lambda s: sums[s][2] - sums[s][1],
              "W": lambda s: -sums[s][2]}
    level = top = 0.0
    for stage, kind in passes:
        level += change[kind](stage)
        top = max(top, level)
    return sum(sums[stage][0] for stage in {stage for stage, _ in passes}) + top


def fits_ranks(problem: PartitionProblem, counts: tuple[int, ...] | list[int], ranks: tuple[RankPasses, ...]) -> bool:
    """Whether every rank's peak (:func:`rank_peak_bytes`) is within the budgets of its stages together."""
    return all(rank_peak_bytes(problem, counts, passes)
               <= sum(problem.capacity_of(stage) for stage in {stage for stage, _ in passes})
               for passes in ranks if passes)


def balance(problem: PartitionProblem, use_memory: bool = True) -> tuple[int, ...] | None:
    """Units per stage of an optimal split (every stage non-empty); None when none fits in memory."""
    n, parts = len(problem.unit_s), problem.parts
    if parts < 1 or n < parts:
        raise ValueError(f"cannot split {n} units into {parts} non-empty stages")
    times = UnitSeconds(problem)
    ends = times.ends
    state = problem.unit_state_bytes or (0.0,) * n
    acts = problem.unit_activation_bytes or (0.0,) * n
    waits = problem.unit_weight_grad_bytes or (0.0,) * n
    recomputing = problem.recomputed_layers is not None
    kept_acts = problem.kept_unit_activation_bytes or (0.0,) * n
    # a stage's memory grows as it starts earlier (a unit that stops recomputing keeps more); its
    # time too unless recomputing one unit costs more than another unit's whole passes
    monotone = not recomputing or min(problem.unit_s) >= max(
        (r - k for r, k in zip(problem.unit_s, problem.kept_unit_s)), default=0.0)
    inf = math.inf
    # best[b]: best bottleneck covering units [0, b) with the stages so far; start[i][b]: where stage i begins
    best = [inf] * (n + 1)
    best[0] = 0.0
    starts: list[list[int]] = []
    for stage in range(parts):
        cap = problem.capacity_of(stage) if use_memory else math.inf
        new = [inf] * (n + 1)
        start = [-1] * (n + 1)
        last = stage == parts - 1
        # stage covers [a, b): at least one unit, leaving one for each later stage
        for b in range(stage + 1, n - (parts - 1 - stage) + 1):
            if last and b != n:
                continue
            held = kept = waiting = 0.0  # the stage's bytes, grown unit by unit as units_bytes adds them
            tail, tail_start = 0.0, b  # what the units that keep their activations keep, from the last
            for a in range(b - 1, stage - 1, -1):
                held += state[a]
                waiting += waits[a]
                if recomputing:
                    end = min(ends[a], b)
                    while tail_start > end:
                        tail_start -= 1
                        tail += kept_acts[tail_start]
                    kept = activation_bytes(problem, a, b, end, tail)
                else:
                    kept += acts[a]
                cost = stage_time_s(problem, stage, a, b, times)
                if cost >= new[b] or stage_bytes(problem, stage, held, kept, waiting) > cap:
                    if monotone:
                        break  # an earlier start only adds work and memory
                    continue
                if best[a] == inf:
                    continue
                value = max(best[a], cost)
                if value < new[b]:
                    new[b], start[b] = value, a
        best = new
        starts.append(start)
    if best[n] == inf:
        return None
    counts, b = [], n
    for stage in range(parts - 1, -1, -1):
        a = starts[stage][b]
        counts.append(b - a)
        b = a
    return tuple(reversed(counts))


def exhaustive(problem: PartitionProblem) -> tuple[float, tuple[int, ...] | None]:
    """(best bottleneck, split) over every split that fits; for checking :func:`balance` on small cases."""
    n, parts = len(problem.unit_s), problem.parts
    best, chosen = math.inf, None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        edges = (0, *cuts, n)
        counts = tuple(edges[i + 1] - edges[i] for i in range(parts))
        if not fits(problem, counts):
            continue
        value = bottleneck_s(problem, counts)
        if value < best:
            best, chosen = value, counts
    return best, chosen
