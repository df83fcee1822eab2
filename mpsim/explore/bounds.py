"""A lower bound on the step time, from the engine input alone (no timeline).

Every rank must do all of its own work, one item after another, and cannot start its
first item before that item's inputs could exist; after its last item it still runs
the optimizer. So for each rank

    step >= earliest start of its first item + its busy time + its optimizer step

where the earliest start follows the forward chain from stage 0 (each earlier stage's
forward plus the transfer between ranks). Waiting on other ranks (the bubble), blocking
sends, link contention and exposed DP communication only add to this, so the bound
holds for every schedule the engine runs. The planner simulates layouts in increasing
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


def rank_counts(schedule: Schedule, keys: list[list[tuple]] | None = None) -> list[tuple[Any, Counter]]:
    """Per rank: its first item and how many items of each duration key it runs (the planner keeps
    it per schedule key in ``plancache.Short``)."""
    return [(items[0] if items else None, Counter(item_keys(items) if keys is None else keys[rank]))
            for rank, items in enumerate(schedule.actions)]


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


def step_lower_bound(schedule: Schedule, action_s: Mapping[tuple, float], transfer_s: Mapping[tuple[int, int], float],
                     finalize_s: Sequence[float] = (), tp_exposed_s: Mapping[tuple, float] | None = None,
                     counts: list[tuple[Any, Counter]] | None = None) -> StepBound:
    """The largest per-rank bound (see the module doc); ``tp_exposed_s`` splits the busy time.

    The arguments are the fields of the same names of ``engine.EngineInput``, so the
    bound can be taken before the rest of the engine input (DP buckets) is priced.
    ``counts`` is ``rank_counts(schedule)`` when the caller kept it and passes a shorter
    schedule with the same stages, ranks and chains.
    """
    heads = forward_heads(schedule, action_s, transfer_s)
    best: StepBound | None = None
    for rank, (first, per_key) in enumerate(counts if counts is not None else rank_counts(schedule)):
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
        bound = StepBound(head + busy + optimizer, rank, head, busy, exposed, optimizer)
        if best is None or bound.lower_bound_s > best.lower_bound_s:
            best = bound
    return best or StepBound(0.0, 0, 0.0, 0.0, 0.0, 0.0)
