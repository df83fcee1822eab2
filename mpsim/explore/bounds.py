"""A lower bound on the step time, from the engine input alone (no timeline).

Every rank must do all of its own work, one item after another, and cannot start its
first item before that item's inputs could exist; after its last item it still runs
the optimizer. So for each rank

    step >= earliest start of its first item + its busy time + its optimizer step

where the earliest start follows the forward chain from stage 0 (each earlier stage's
forward plus the transfer between ranks). Its last backward (or input-gradient pass) sends
a gradient that the stages before it in the chain still have to carry back, one backward
after another, to the chain's first stage, whose rank then runs its optimizer step; the
rank's own items after that backward (weight-gradient passes) run meanwhile:

    step >= ... + its busy time + max(its optimizer, tail + optimizer of that first stage's rank - after)

with the tail the backward chain's passes and transfers, and ``after`` the rank's items
after its last backward. For 1F1B with uniform stages and free transfers the last rank's
bound is then (p - 1)(F + B) + m(F + B): the step itself.
The optimizer step also waits for the rank's gradient reductions. A stage's final DP
buckets become ready while the item that makes its gradients final runs, and the rank's
DP stream sends them one at a time, so what the rest of that item (and the items after
it) cannot hide of them comes before the optimizer: ``exposed_reduction_s``. The chain's
first stage pays the same after the drain.
Waiting on other ranks (the bubble), blocking sends, link contention and the rest of the
DP communication only add to this, so the bound holds for every schedule the engine runs.
A chain stage whose backward runs inside a forward+backward pair (DualPipe) adds the pair:
it cannot start before the gradient it takes has come. The planner simulates layouts in increasing
order of this bound and stops once the bound alone exceeds the step time of the layouts
it would show: those cannot rank higher, whatever their bubble.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from mpsim.explore.memwalk import item_keys
from mpsim.schedules.actions import Schedule, completing_items, parts, stages_by_rank


@dataclass(frozen=True)
class StepBound:
    """The bound and the rank that sets it, with that rank's busy time split."""

    lower_bound_s: float
    rank: int
    head_s: float  # earliest start of the rank's first item
    busy_s: float  # its items back to back
    tp_exposed_s: float  # of which TP communication not hidden under compute
    optimizer_s: float
    tail_s: float = 0.0  # beyond its optimizer: the backward chain still to run after its items (the drain)
    dp_s: float = 0.0  # beyond its optimizer and drain: gradient reductions no compute can hide


def _carries_gradient(key: tuple) -> bool:
    """Whether an item of this duration key runs a backward or input-gradient pass."""
    return key[-1] in ("B", "I")


def rank_counts(schedule: Schedule, keys: list[list[tuple]] | None = None
                ) -> list[tuple[Any, Any, Counter, Counter, tuple]]:
    """Per rank: its first item, its last item that runs a backward (or input-gradient) pass,
    the duration keys of the items after that one, how many items of each duration key it
    runs, and per stage whose gradients an item of it makes final (its last backward or
    weight-gradient pass, as the engine finds it), ``(stage, that item's key, the keys of
    the items after it)`` (the planner keeps it per schedule key in ``plancache.Short``)."""
    held = stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)
    found = []
    for rank, items in enumerate(schedule.actions):
        here = item_keys(items) if keys is None else keys[rank]
        position = len(here) - 1
        while position >= 0 and not _carries_gradient(here[position]):
            position -= 1
        last_backward = items[position] if position >= 0 else None
        found.append((items[0] if items else None, last_backward, Counter(here[position + 1:]), Counter(here),
                      _completing(items, held[rank], here)))
    return found


_KIND_NAMES = ("F", "B", "I", "W")  # memwalk.KIND_CODE's order


def _key_of(code: int) -> tuple[int, str]:
    """The duration key of a ``4 x stage + kind`` code."""
    return code >> 2, _KIND_NAMES[code & 3]


def rank_counts_of_read(schedule: Schedule, read: Any) -> list[tuple[Any, Any, Counter, Counter, tuple]]:
    """``rank_counts`` of a schedule without overlapped pairs, from its arrays (``memwalk.ScheduleRead``).

    Each (stage, kind) is run by one rank, the stage's, so its count and first position over
    the whole schedule are its rank's, and so are a stage's last backward and weight passes.
    The Counters are built in the order of first appearance, as ``Counter`` over the list is.
    """
    code = 4 * read.stage + read.kind
    keys, first, counts = np.unique(code, return_index=True, return_counts=True)
    order = np.argsort(first)
    keys, counts = keys[order].tolist(), counts[order].tolist()
    key_bounds = read.bounds(first[order])
    gradient = np.flatnonzero((read.kind == 1) | (read.kind == 2))  # backward or input-gradient passes
    last_gradient = np.searchsorted(gradient, read.ends) - 1
    made = np.flatnonzero((read.kind == 1) | (read.kind == 3))[::-1]  # backward or weight passes, last first
    stages, latest = np.unique(read.stage[made], return_index=True)
    last_made = dict(zip(stages.tolist(), made[latest].tolist()))  # stage -> its last such position
    held = stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)
    found = []
    for rank in range(len(read.starts)):
        start, end = int(read.starts[rank]), int(read.ends[rank])
        position = int(gradient[last_gradient[rank]]) if last_gradient[rank] >= 0 else -1
        if position < start:
            position = -1
        tail = code[(position + 1 if position >= 0 else start):end].tolist()
        per_key = Counter(dict(zip(map(_key_of, keys[key_bounds[rank]:key_bounds[rank + 1]]),
                                   counts[key_bounds[rank]:key_bounds[rank + 1]])))
        latest_first = sorted(((last_made[s], s) for s in held[rank] if s in last_made), reverse=True)
        completing = tuple((s, _key_of(int(code[p])), Counter(map(_key_of, code[p + 1:end].tolist())))
                           for p, s in latest_first)
        found.append((read.actions[start] if end > start else None,
                      read.actions[position] if position >= 0 else None,
                      Counter(map(_key_of, tail)), per_key, completing))
    return found


def _completing(items: tuple, stages: list[int], here: list[tuple]) -> tuple:
    """``(stage, key, keys after it)`` per stage of ``stages`` (the rank's) whose last backward or
    weight pass is among the rank's ``items`` (``here``: their duration keys)."""
    return tuple((stage, here[position], Counter(here[position + 1:]))
                 for position, stages_there in completing_items(items, stages).items() for stage in stages_there)


def _reductions_after(ranked: list, action_s: Mapping[tuple, float], grad_buckets: Mapping[int, Sequence[Any]],
                      overlap_grad_sync: bool) -> list[dict[int, tuple[float, Counter]]]:
    """Per rank, per stage whose gradients it reduces: (least time its DP stream needs after the
    item that made them final, the keys of the rank's items after that item).

    The engine queues a stage's final buckets as that item runs (``overlap_grad_sync``), or all
    of a rank's after its last item, where none of it can hide (then every stage of the rank
    maps to the whole sum, with no item after).
    """
    found = []
    for entry in ranked:
        made = entry[4]
        if not grad_buckets:
            found.append({})
        elif overlap_grad_sync:
            found.append({stage: (exposed_reduction_s(grad_buckets.get(stage, ()), action_s[key]), later)
                          for stage, key, later in made})
        else:
            total = sum(bucket.duration_s for stage, _, _ in made for bucket in grad_buckets.get(stage, ()))
            found.append({stage: (total, Counter()) for stage, _, _ in made})
    return found


def exposed_reduction_s(buckets: Sequence[Any], item_s: float) -> float:
    """Least time a rank's DP stream still needs after the item that makes these buckets ready ends.

    A bucket is ready ``ready_fraction`` into the item; the stream sends one bucket at a
    time, each taking at least its ``duration_s`` (sharing a link only slows it). So the
    buckets ready at or after a fraction ``f`` still need their summed time from there, of
    which at most ``(1 - f) x item_s`` fits under the item.
    """
    least, remaining = 0.0, 0.0
    for bucket in sorted(buckets, key=lambda b: b.ready_fraction, reverse=True):
        remaining += bucket.duration_s
        least = max(least, remaining - (1.0 - bucket.ready_fraction) * item_s)
    return least


def forward_heads(schedule: Schedule, action_s: Mapping[tuple, float],
                  transfer_s: Mapping[tuple[int, int], float]) -> list[float]:
    """Earliest time each stage's forward can start: the chain of forwards and transfers before it."""
    rank_of, chains = schedule.stage_to_rank, schedule.topology
    heads = []
    for stage in range(schedule.num_stages):
        before = chains.previous(stage)  # None at the start of a chain (each has its own inputs)
        if before is None:
            heads.append(0.0)
            continue
        hop = transfer_s.get((before, stage), 0.0) if rank_of[before] != rank_of[stage] else 0.0
        heads.append(heads[before] + action_s[(before, "F")] + hop)
    return heads


def backward_tails(schedule: Schedule, action_s: Mapping[tuple, float],
                   transfer_s: Mapping[tuple[int, int], float]) -> list[float] | None:
    """Least time from the end of each stage's backward of a microbatch to the end of the chain's
    first stage's backward of it: per stage before it in the chain, the shortest item that can
    carry that backward (a backward or input-gradient pass, or a forward+backward pair holding
    one: a pair starts once the gradient is there and sends its own at its end), and the
    transfers between ranks. None where a chain stage has no such item priced."""
    rank_of, chains = schedule.stage_to_rank, schedule.topology
    shortest: dict[int, float] = {}
    for key, seconds in action_s.items():
        if len(key) == 2 and key[1] in ("B", "I"):
            stage = key[0]
        elif len(key) == 4 and key[3] in ("B", "I"):
            stage = key[2]
        else:
            continue
        if seconds < shortest.get(stage, float("inf")):
            shortest[stage] = seconds
    tails: list[float] = []
    for stage in range(schedule.num_stages):
        before = chains.previous(stage)
        if before is None:
            tails.append(0.0)
            continue
        if before not in shortest:
            return None
        hop = 0.0
        if rank_of[before] != rank_of[stage]:
            hop = transfer_s.get((stage, before), transfer_s.get((before, stage), 0.0))
        tails.append(tails[before] + hop + shortest[before])
    return tails


def step_lower_bound(schedule: Schedule, action_s: Mapping[tuple, float], transfer_s: Mapping[tuple[int, int], float],
                     finalize_s: Sequence[float] = (), tp_exposed_s: Mapping[tuple, float] | None = None,
                     counts: list[tuple[Any, Any, Counter, Counter, tuple]] | None = None,
                     grad_buckets: Mapping[int, Sequence[Any]] | None = None,
                     overlap_grad_sync: bool = True, overlapping_steps: bool = False) -> StepBound:
    """The largest per-rank bound (see the module doc); ``tp_exposed_s`` splits the busy time.

    ``overlapping_steps``: the bound on the period of a run whose steps overlap their
    neighbours (``training.optimizer_post_validation``): the fill before a rank's first
    item and the drain after its last backward may run under the neighbouring steps, so
    only the rank's own items, reductions and optimizer step count.

    The arguments are the fields of the same names of ``engine.EngineInput``, so the
    bound can be taken before the rest of the engine input (the links sends and buckets
    share, the buckets actions start each time they run) is priced; without
    ``grad_buckets`` it leaves the reductions out.
    ``counts`` is ``rank_counts(schedule)`` when the caller kept it and passes a shorter
    schedule with the same stages, ranks and chains.
    """
    heads = forward_heads(schedule, action_s, transfer_s)
    ranked = counts if counts is not None else rank_counts(schedule)
    tails = backward_tails(schedule, action_s, transfer_s)
    rank_of, chains = schedule.stage_to_rank, schedule.topology
    reductions = _reductions_after(ranked, action_s, grad_buckets or {}, overlap_grad_sync)
    best: StepBound | None = None
    for rank, (first, last_backward, after_it, per_key, _) in enumerate(ranked):
        if first is None:
            continue
        head = 0.0
        for action in parts(first) if not overlapping_steps else ():
            earliest = heads[action.stage]
            if action.kind != "F":
                earliest += action_s[(action.stage, "F")]  # a backward follows its own forward
            head = max(head, earliest)
        busy = sum(count * action_s[key] for key, count in per_key.items())
        exposed = sum(count * tp_exposed_s.get(key, 0.0) for key, count in per_key.items()) if tp_exposed_s \
            else 0.0
        optimizer = finalize_s[rank] if finalize_s else 0.0
        after, reduced = optimizer, 0.0  # from the end of the rank's last item to the end of the step; DP of it
        for reduction, later in reductions[rank].values():
            # the item that made these gradients final ends head + busy - (the items after it) at
            # the earliest, and the rank's optimizer waits for their reductions
            if optimizer + reduction > after:  # else the items after it cannot make it count
                reduction -= sum(count * action_s[key] for key, count in later.items())
                if optimizer + reduction > after:
                    after, reduced = optimizer + reduction, reduction
        if tails is not None and last_backward is not None and not overlapping_steps:
            # the items up to the rank's last backward end head + busy - left at the earliest; its
            # gradient then goes back down the chain while the rest of the rank's items run, and
            # the chain's first stage reduces its gradients before its rank's optimizer step
            left = sum(count * action_s[key] for key, count in after_it.items())
            for action in parts(last_backward):
                if action.kind in ("B", "I") and tails[action.stage] > 0:
                    head_stage = chains.first(action.stage)
                    then = finalize_s[rank_of[head_stage]] if finalize_s else 0.0
                    reduction = reductions[rank_of[head_stage]].get(head_stage, (0.0, 0.0))[0]
                    if tails[action.stage] + reduction + then - left > after:
                        after, reduced = tails[action.stage] + reduction + then - left, reduction
        bound = StepBound(head + busy + after, rank, head, busy, exposed, optimizer, after - optimizer - reduced,
                          reduced)
        if best is None or bound.lower_bound_s > best.lower_bound_s:
            best = bound
    return best or StepBound(0.0, 0, 0.0, 0.0, 0.0, 0.0)
