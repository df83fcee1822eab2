"""Shorter schedules that answer the planner's questions about a layout as the full one would.

``memory_schedule`` has the same activation peak; ``distinct_items`` has the same
costs to price.

``results.memory.rank_memory`` walks each rank's action list: a forward holds its
stage's activations, a backward frees them, an input-gradient backward swaps them for
the weight-gradient buffer that its ``W`` frees. What a rank holds after each action
is a *state*: how many activations and buffers of each of its stages it holds. The
bytes held are a function of the state (a sum over its counts, plus, for ZeRO-3 without
``reshard_after_forward``, the gathered parameters of each stage whose count is above
zero), so the peak is the largest such value over the states the walk passes through,
whatever the bytes per stage are.

Bytes are never negative, so the level rises only in ``F`` and ``I``, and a state
followed by another ``F`` holds less than the next one: the peak is at one of the
*turning* states (after ``F`` or ``I``, not followed by ``F``), and a long schedule has
few distinct ones (1F1B's steady phase repeats the same one for every microbatch).
``memory_schedule`` keeps, of each rank's actions, the real path to each distinct
turning state: it drops each stretch that leaves the state where the kept list ends and
comes back to it without reaching a new one, and all that follows the last one. Every
state of the short walk is a state of the full one, and every possible peak is on it,
so ``rank_memory`` finds the same activation peak and hence the same
``peak_memory_bytes`` and largest category (to rounding: a running sum that takes
another path to the same state), several times faster. The forwards in
flight at an exactly tied peak and the layers-only peak may differ; the planner uses
neither. A simulated layout's report still walks the full schedule.
"""

from __future__ import annotations

from dataclasses import replace

from mpsim.engine.core import duration_key
from mpsim.schedules.actions import Action, Schedule, flat

def _states(actions: list[Action], slot: dict[int, int], width: int) -> list[tuple[int, ...]]:
    """The state after each action: held activations per stage, then held weight-gradient buffers."""
    state = [0] * (2 * width)
    out = []
    for action in actions:
        i = slot[action.stage]
        if action.kind == "F":
            state[i] += 1
        elif action.kind == "B":
            state[i] -= 1
        elif action.kind == "I":
            state[i] -= 1
            state[width + i] += 1
        else:  # W
            state[width + i] -= 1
        out.append(tuple(state))
    return out


def _compress(actions: list[Action], stages: tuple[int, ...]) -> tuple[Action, ...]:
    slot = {stage: i for i, stage in enumerate(stages)}
    states = _states(actions, slot, len(stages))
    # the level rises only in F and I, and a state followed by an F is covered by the next
    # one: the peak is at a state after F or I that is not followed by an F
    wanted = {state for index, (state, action) in enumerate(zip(states, actions))
              if action.kind in ("F", "I") and (index + 1 == len(actions) or actions[index + 1].kind != "F")}
    kept: list[Action] = []
    start = 0  # first action not yet kept
    anchor = (0,) * (2 * len(stages))  # the state after the last kept action
    for index, now in enumerate(states):
        if now in wanted:  # a state that may hold the peak: keep the real path to it
            wanted.discard(now)
            kept.extend(actions[start:index + 1])
            start, anchor = index + 1, now
            if not wanted:
                break  # nothing after the last candidate can raise the peak
        elif now == anchor:  # back where the kept list ends: the loop reached nothing needed
            start = index + 1
    return tuple(kept)


def memory_schedule(schedule: Schedule) -> Schedule:
    """The schedule with each rank's list shortened as the module doc describes.

    Not cached here: the planner keeps the short forms per schedule key (``plancache.Short``)
    and lets the full lists go, so the cycle collector never walks their actions again.
    """
    ranks = []
    for rank, items in enumerate(schedule.actions):
        stages = tuple(s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank)
        ranks.append(_compress(flat(items), stages))
    return replace(schedule, actions=tuple(ranks))


def distinct_items(schedule: Schedule) -> Schedule:
    """The schedule with one item per duration key: what ``schedule_costs`` prices, without repeats.

    ``schedule_costs`` prices every overlapped pair it meets, and a DualPipe schedule
    meets the same pair of stages once per microbatch; the costs are the same dict.
    """
    seen: set = set()
    ranks = []
    for items in schedule.actions:
        kept = []
        for item in items:
            key = duration_key(item)
            if key not in seen:
                seen.add(key)
                kept.append(item)
        ranks.append(tuple(kept))
    return replace(schedule, actions=tuple(ranks))
