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
Waiting on other ranks (the bubble), blocking sends, link contention and exposed DP
communication only add to this, so the bound holds for every schedule the engine runs.
A chain stage whose backward runs inside a forward+backward pair (DualPipe) adds the pair:
it cannot start before the gradient it takes has come. The planner simulates layouts in increasing
order of this bound and stops once the bound alone exceeds the step time of the layouts
it would show: those cannot rank higher, whatever their bubble.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections import Counter
from typing import Any, Mapping, Sequence

from mpsim.explore.memwalk import item_keys
from mpsim.schedules.actions import Schedule, parts


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


def _carries_gradient(key: tuple) -> bool:
    """Whether an item of this duration key runs a backward or input-gradient pass."""
    return key[-1] in ("B", "I")


def rank_counts(schedule: Schedule, keys: list[list[tuple]] | None = None
                ) -> list[tuple[Any, Any, Counter, Counter]]:
    """Per rank: its first item, its last item that runs a backward (or input-gradient) pass,
    the duration keys of the items after that one, and how many items of each duration key it
    runs (the planner keeps it per schedule key in ``plancache.Short``)."""
    found = []
    for rank, items in enumerate(schedule.actions):
        here = item_keys(items) if keys is None else keys[rank]
        position = len(here) - 1
        while position >= 0 and not _carries_gradient(here[position]):
            position -= 1
        last_backward = items[position] if position >= 0 else None
        found.append((items[0] if items else None, last_backward, Counter(here[position + 1:]), Counter(here)))
    return found


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
                     counts: list[tuple[Any, Any, Counter, Counter]] | None = None) -> StepBound:
    """The largest per-rank bound (see the module doc); ``tp_exposed_s`` splits the busy time.

    The arguments are the fields of the same names of ``engine.EngineInput``, so the
    bound can be taken before the rest of the engine input (DP buckets) is priced.
    ``counts`` is ``rank_counts(schedule)`` when the caller kept it and passes a shorter
    schedule with the same stages, ranks and chains.
    """
    heads = forward_heads(schedule, action_s, transfer_s)
    ranked = counts if counts is not None else rank_counts(schedule)
    tails = backward_tails(schedule, action_s, transfer_s)
    rank_of, chains = schedule.stage_to_rank, schedule.topology
    best: StepBound | None = None
    for rank, (first, last_backward, after_it, per_key) in enumerate(ranked):
        if first is None:
            continue
        head = 0.0
        for action in parts(first):
            earliest = heads[action.stage]
            if action.kind != "F":
                earliest += action_s[(action.stage, "F")]  # a backward follows its own forward
            head = max(head, earliest)
        busy = sum(count * action_s[key] for key, count in per_key.items())
        exposed = sum(count * tp_exposed_s.get(key, 0.0) for key, count in per_key.items()) if tp_exposed_s \
            else 0.0
        optimizer = finalize_s[rank] if finalize_s else 0.0
        after = optimizer  # from the end of the rank's last item to the end of the step
        if tails is not None and last_backward is not None:
            # the items up to the rank's last backward end head + busy - left at the earliest; its
            # gradient then goes back down the chain while the rest of the rank's items run
            left = sum(count * action_s[key] for key, count in after_it.items())
            for action in parts(last_backward):
                if action.kind in ("B", "I") and tails[action.stage] > 0:
                    head_stage = chains.first(action.stage)
                    then = finalize_s[rank_of[head_stage]] if finalize_s else 0.0
                    after = max(after, tails[action.stage] + then - left)
        bound = StepBound(head + busy + after, rank, head, busy, exposed, optimizer, after - optimizer)
        if best is None or bound.lower_bound_s > best.lower_bound_s:
            best = bound
    return best or StepBound(0.0, 0, 0.0, 0.0, 0.0, 0.0)
