"""Checks a schedule must pass before it is simulated.

Every (stage, microbatch) runs its forward once and its backward once (as ``B``, or as
``I`` then ``W``), each on the rank that holds the stage, and the dependencies can all
be met: a dry run in unit time executes every rank's list in order, and if it stalls
the first rank whose next action can never run is named, with what it waits for.
With several chains (``chains.py``) each stage's microbatches are its chain's share, and
dependencies stop at chain boundaries.
"""

from __future__ import annotations

from collections import Counter

from mpsim.schedules.actions import Action, Schedule, flat, parts
from mpsim.schedules.chains import StageChains


class ScheduleError(ValueError):
    """A schedule that cannot run as written."""


def dependencies(action: Action, chains: StageChains) -> list[Action | tuple[int, str, int]]:
    """What must have run before ``action``: (stage, kind-set, microbatch) triples.

    A backward needs the next stage's input gradient, which either ``B`` or ``I``
    produces; the kind ``"BI"`` stands for "whichever of the two the schedule uses".
    """
    stage, kind, mb = action
    if kind == "F":
        before = chains.previous(stage)
        return [(before, "F", mb)] if before is not None else []
    if kind in ("B", "I"):
        deps: list = [(stage, "F", mb)]
        after = chains.next(stage)
        if after is not None:
            deps.append((after, "BI", mb))
        return deps
    return [(stage, "I", mb)]  # W


def check_coverage(schedule: Schedule) -> None:
    """Every action on its stage's rank, every forward and backward exactly once."""
    chains = schedule.topology
    if schedule.num_microbatches % chains.count:
        raise ScheduleError(f"{schedule.num_microbatches} microbatches do not split evenly over the "
                            f"{chains.count} pipelines (chains) of the schedule")
    counts: Counter = Counter()
    for rank, actions in enumerate(schedule.actions):
        for action in flat(actions):
            if action.stage >= schedule.num_stages:
                raise ScheduleError(f"rank {rank}: {action} names stage {action.stage}, but there are only "
                                    f"{schedule.num_stages} stages")
            owner = schedule.stage_to_rank[action.stage]
            if owner != rank:
                raise ScheduleError(f"rank {rank}: {action} belongs to stage {action.stage}, which rank {owner} holds")
            if action.microbatch >= schedule.num_microbatches:
                raise ScheduleError(f"rank {rank}: {action} names microbatch {action.microbatch}, but there are "
                                    f"only {schedule.num_microbatches}")
            carried = chains.microbatches(action.stage, schedule.num_microbatches)
            if action.microbatch not in carried:
                raise ScheduleError(f"rank {rank}: {action} names microbatch {action.microbatch}, but stage "
                                    f"{action.stage}'s pipeline carries microbatches {carried.start}.."
                                    f"{carried.stop - 1}")
            counts[action] += 1
    for action, count in counts.items():
        if count > 1:
            raise ScheduleError(f"{action} appears {count} times on rank {schedule.stage_to_rank[action.stage]}")
    for stage in range(schedule.num_stages):
        rank = schedule.stage_to_rank[stage]
        for mb in chains.microbatches(stage, schedule.num_microbatches):
            if not counts[Action(stage, "F", mb)]:
                raise ScheduleError(f"rank {rank}: forward {Action(stage, 'F', mb)} is missing")
            full, inp, weight = (counts[Action(stage, k, mb)] for k in "BIW")
            if full and (inp or weight):
                raise ScheduleError(f"rank {rank}: stage {stage} microbatch {mb} has both B and I/W backward actions")
            if not full and not inp:
                raise ScheduleError(f"rank {rank}: backward {Action(stage, 'B', mb)} (or {Action(stage, 'I', mb)}) "
                                    f"is missing")
            if inp and not weight:
                raise ScheduleError(f"rank {rank}: {Action(stage, 'I', mb)} has no matching {Action(stage, 'W', mb)}")
            if weight and not inp:
                raise ScheduleError(f"rank {rank}: {Action(stage, 'W', mb)} has no matching {Action(stage, 'I', mb)}")


def check_runnable(schedule: Schedule) -> None:
    """Dry-run the lists in order; a stall names the first blocked rank and action."""
    done: set[tuple[int, str, int]] = set()
    position = [0] * schedule.num_ranks
    remaining = sum(len(actions) for actions in schedule.actions)

    def blockers(item) -> list[tuple[int, str, int]]:
        return [dep for action in parts(item) for dep in dependencies(action, schedule.topology)
                if not satisfied(dep)]

    def satisfied(dep: tuple[int, str, int]) -> bool:
        stage, kinds, mb = dep
        return any((stage, kind, mb) in done for kind in kinds)

    while remaining:
        progressed = False
        for rank, actions in enumerate(schedule.actions):
            while position[rank] < len(actions):
                item = actions[position[rank]]
                if blockers(item):
                    break
                done.update(tuple(action) for action in parts(item))
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            for rank, actions in enumerate(schedule.actions):
                if position[rank] < len(actions):
                    item = actions[position[rank]]
                    stage, kinds, mb = blockers(item)[0]
                    needed = " or ".join(f"{stage}{k}{mb}" for k in kinds)
                    raise ScheduleError(f"deadlock: rank {rank} can never run {item} (action {position[rank]} "
                                        f"of its list): it waits for {needed}, which cannot run first")


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless the schedule can be simulated."""
    check_coverage(schedule)
    check_runnable(schedule)
