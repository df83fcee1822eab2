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

from dataclasses import dataclass, replace
from operator import itemgetter

import numpy as np

from mpsim.engine.core import duration_key
from mpsim.schedules.actions import Action, Overlapped, Schedule, flat

KIND_CODE = {"F": 0, "B": 1, "I": 2, "W": 3}
_STAGE, _KIND, _MICROBATCH = itemgetter(0), itemgetter(1), itemgetter(2)
_ACTION_KEY = itemgetter(0, 1)  # an action's duration key, (stage, kind)


def rank_actions(items: tuple) -> list[Action] | tuple:
    """A rank's compute actions in order (its items, with overlapped pairs expanded)."""
    return flat(items) if Overlapped in set(map(type, items)) else items


def item_keys(items: tuple) -> list[tuple]:
    """The duration key of each of a rank's items (``engine.core.duration_key``): read straight
    off the tuples where every item is a plain action, else (pairs, unsharding actions) one by one."""
    if set(map(type, items)) <= {Action}:
        return list(map(_ACTION_KEY, items))
    return list(map(duration_key, items))


def read_actions(actions) -> tuple[np.ndarray, np.ndarray]:
    """(stage, kind code) of each action, as arrays (read at C speed: no Python per action)."""
    count = len(actions)
    stage = np.fromiter(map(_STAGE, actions), dtype=np.int64, count=count)
    kind = np.fromiter(map(KIND_CODE.__getitem__, map(_KIND, actions)), dtype=np.int64, count=count)
    return stage, kind


def microbatches(actions) -> np.ndarray:
    return np.fromiter(map(_MICROBATCH, actions), dtype=np.int64, count=len(actions))


def _state_ids(states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id of each row, first row of each id): equal rows get equal ids. Rows are packed column
    by column into one integer, ``id x span + value``, renumbered densely whenever the next
    column could overflow 64 bits, so the ids are exact whatever the counts."""
    limit = 2 ** 62
    packed = np.zeros(len(states), dtype=np.int64)
    top = 1  # packed < top
    for column in states.T:
        low = int(column.min())
        span = int(column.max()) - low + 1
        if span == 1:
            continue
        if top * span >= limit:
            _, packed = np.unique(packed, return_inverse=True)
            top = int(packed.max()) + 1
        packed = packed * span + (column - low)
        top *= span
    _, first, ids = np.unique(packed, return_index=True, return_inverse=True)
    return ids.reshape(-1), first


# rows x columns of one batch of lists' states: lists are shortened together (a call per list
# costs more than its arithmetic) in batches of at most this many cells (64 MiB of int64)
BATCH_CELLS = 1 << 23


def stage_slots(stage_to_rank: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Each stage's place among the stages of its rank, and the most stages a rank holds."""
    held = [0] * (max(stage_to_rank, default=-1) + 1)
    slots = np.zeros(len(stage_to_rank), dtype=np.int64)
    for stage, rank in enumerate(stage_to_rank):
        slots[stage] = held[rank]
        held[rank] += 1
    return slots, max(held, default=0)


def kept_positions(stage: np.ndarray, kind: np.ndarray, stage_to_rank: tuple[int, ...],
                   starts: np.ndarray) -> np.ndarray:
    """Which actions the short walk keeps (module doc), as positions, ascending.

    The ranks' lists are laid end to end: ``stage`` and ``kind`` are ``read_actions``'s
    arrays of all of them, list ``r`` (rank ``r``'s) starting at ``starts[r]``. Lists are
    shortened a batch at a time (``BATCH_CELLS``); each list on its own, as if alone.
    """
    slots, width = stage_slots(stage_to_rank)
    owner = np.asarray(stage_to_rank, dtype=np.int64)
    count, lists = len(stage), len(starts)
    ends = np.append(starts[1:], count).astype(np.int64)
    segment = np.repeat(np.arange(lists), ends - starts)
    wrong = owner[stage] != segment
    if wrong.any():
        raise KeyError(f"an action of stage {int(stage[wrong][0])}, which the rank does not hold")
    kept, first = [], 0
    while first < lists:
        last = first + 1  # one list at least, then as many as the batch holds
        while last < lists and (ends[last] - starts[first]) * (2 * width + 1) <= BATCH_CELLS:
            last += 1
        rows = slice(int(starts[first]), int(ends[last - 1]))
        found = _kept_in_batch(stage[rows], kind[rows], slots[stage[rows]], width,
                               starts[first:last] - starts[first], segment[rows] - first)
        kept.append(found + starts[first])
        first = last
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)


def _kept_in_batch(stage: np.ndarray, kind: np.ndarray, slot: np.ndarray, width: int, starts: np.ndarray,
                   segment: np.ndarray) -> np.ndarray:
    """``kept_positions`` of one batch of lists (``segment``: the list of each action).

    The states are one running sum per column (a forward adds one activation of its stage,
    a backward takes one, an input-gradient pass moves one to the stage's buffer column, a
    weight-gradient pass takes one from it), each list's from zero; equal states of one
    list get one id (the list is a column of the state). Walking a list, a wanted state (one
    that some turning position reaches) is kept with the real path to it the first time it
    is reached, from just after the last return, since the previous one, to the state kept
    before it (at first: the empty state). The same actions as a loop that follows each
    list one action at a time, with array operations only.
    """
    count, lists = len(stage), len(starts)
    if not count:
        return np.zeros(0, dtype=np.int64)
    deltas = np.zeros((count, 2 * width), dtype=np.int64)
    rows = np.arange(count)
    forward, full, split, weight = (kind == code for code in range(4))
    deltas[rows[forward], slot[forward]] = 1
    frees = full | split
    deltas[rows[frees], slot[frees]] = -1
    deltas[rows[split], width + slot[split]] = 1
    deltas[rows[weight], width + slot[weight]] = -1
    states = np.cumsum(deltas, axis=0)
    if lists > 1:  # each list's sum from zero: less what the lists before it left
        left = np.zeros((lists, 2 * width), dtype=np.int64)
        begun = starts > 0
        left[begun] = states[starts[begun] - 1]
        states -= left[segment]
    ids, first = _state_ids(np.column_stack((segment, states)))
    # the level rises only in F and I, and a state followed by an F is covered by the next
    # one: the peak is at a state after F or I that is not followed by an F (of its own list)
    followed = np.append(forward[1:], False)
    followed[np.append(starts[1:], count) - 1] = False
    turning = (forward | split) & ~followed
    reached = np.sort(first[np.unique(ids[turning])])  # where each wanted state is first reached
    if not len(reached):
        return np.zeros(0, dtype=np.int64)
    owner = segment[reached]
    opens = np.append(True, owner[1:] != owner[:-1])  # the first wanted state of its list
    before = np.where(opens, starts[owner] - 1, np.append(-1, reached[:-1]))  # the previous kept position
    empty = np.flatnonzero(~states.any(axis=1))
    empty_id = np.full(lists, -1, dtype=np.int64)  # each list's empty state, where it passes one
    empty_id[segment[empty]] = ids[empty]
    anchor = np.where(opens, empty_id[owner], np.append(-1, ids[reached[:-1]]))  # the state kept last
    # each position up to the last reached one lies in the stretch of the first reached one at or
    # after it (past a list's last, a later list's, whose states, and so anchors, it never equals)
    upto = np.arange(int(reached[-1]) + 1)
    stretch = np.searchsorted(reached, upto)
    returns = np.flatnonzero((ids[upto] == anchor[stretch]) & (upto != reached[stretch]))
    start = before + 1
    if len(returns):
        last = np.append(stretch[returns][1:] != stretch[returns][:-1], True)  # the last return in each stretch
        start[stretch[returns][last]] = returns[last] + 1
    # the union of [start, reached] over the stretches, which follow each other
    edges = np.zeros(int(reached[-1]) + 2, dtype=np.int64)
    np.add.at(edges, start, 1)
    np.add.at(edges, reached + 1, -1)
    return np.flatnonzero(np.cumsum(edges[:-1]) > 0)


@dataclass(frozen=True)
class ScheduleRead:
    """A schedule's compute actions read once into arrays, every rank's list laid end to end."""

    actions: list  # the actions themselves, in that order
    stage: np.ndarray
    kind: np.ndarray  # KIND_CODE of each
    microbatch: np.ndarray
    starts: np.ndarray  # where each rank's list begins and ends
    ends: np.ndarray
    plain: bool  # no overlapped pairs: the actions are the ranks' items, position for position

    @classmethod
    def of(cls, schedule: Schedule) -> "ScheduleRead":
        lists = [rank_actions(items) for items in schedule.actions]
        lengths = np.array([len(actions) for actions in lists], dtype=np.int64)
        ends = np.cumsum(lengths)
        actions = [action for listed in lists for action in listed]
        stage, kind = read_actions(actions)
        plain = all(listed is items for listed, items in zip(lists, schedule.actions))
        return cls(actions, stage, kind, microbatches(actions), ends - lengths, ends, plain)

    def bounds(self, positions: np.ndarray) -> np.ndarray:
        """Where each rank's share of the ascending ``positions`` begins, and the end of the last."""
        return np.searchsorted(positions, np.append(self.starts, self.ends[-1:]))


def distinct_of_read(schedule: Schedule, read: ScheduleRead) -> Schedule:
    """``distinct_items`` of a schedule without overlapped pairs, from its arrays: each (stage,
    kind) is run by one rank, the stage's, so its first position there is the one kept."""
    _, first = np.unique(4 * read.stage + read.kind, return_index=True)
    first.sort()
    bounds = read.bounds(first)
    return replace(schedule, actions=tuple(tuple(read.actions[i] for i in first[bounds[r]:bounds[r + 1]].tolist())
                                           for r in range(len(read.starts))))


def memory_schedule(schedule: Schedule) -> Schedule:
    """The schedule with each rank's list shortened as the module doc describes.

    Not cached here: the planner keeps the short forms per schedule key (``plancache.Short``)
    and lets the full lists go, so the cycle collector never walks their actions again.
    """
    read = ScheduleRead.of(schedule)
    keep = kept_positions(read.stage, read.kind, schedule.stage_to_rank, read.starts)
    bounds = read.bounds(keep)
    return replace(schedule, actions=tuple(tuple(read.actions[i] for i in keep[bounds[r]:bounds[r + 1]].tolist())
                                           for r in range(len(read.starts))))


def distinct_items(schedule: Schedule, keys: list[list[tuple]] | None = None) -> Schedule:
    """The schedule with one item per duration key: what ``schedule_costs`` prices, without repeats.

    ``schedule_costs`` prices every overlapped pair it meets, and a DualPipe schedule
    meets the same pair of stages once per microbatch; the costs are the same dict.
    ``keys``: each rank's ``item_keys``, when the caller has them.
    """
    seen: set = set()
    ranks = []
    for rank, items in enumerate(schedule.actions):
        here = item_keys(items) if keys is None else keys[rank]
        first = dict(zip(reversed(here), range(len(here) - 1, -1, -1)))  # each key's first position
        kept = sorted(position for key, position in first.items() if key not in seen)
        seen.update(first)
        ranks.append(tuple(items[position] for position in kept))
    return replace(schedule, actions=tuple(ranks))
