"""The planner's memory check as array operations: every rank of a layout at once.

``results.memory.rank_memory`` gives each pipeline rank's peak as the model state and
buffers it holds whatever the schedule does (``RankState``) plus the peak of a walk over
its action list. The planner asks that of thousands of layouts, and most of the work
repeats:

* The walk adds, after each action, a change that depends only on the action's stage
  and kind and on the layout's bytes per stage: ``+a`` for a forward, ``-a`` for a
  backward, ``w - a`` for an input-gradient pass, ``-w`` for a weight-gradient pass
  (``a`` a microbatch's activations, ``w`` the buffer its deferred weight gradient
  keeps). So a schedule is read once (``ShortWalk``): per rank, the index of each
  action's change in a table of ``4 x stages`` numbers (plus one zero, which pads the
  shorter ranks to a matrix). A layout fills the table from its workload, gathers, and
  takes a running sum along each row: ``numpy.cumsum`` adds in order, like the loop, and
  a padding zero comes only after a row's last action, so each row's levels, and their
  maximum, are the loop's to the bit.
* The state and buffers depend on the layout and on which stages each rank holds, not
  on the order of the actions: ``LayoutMemory`` keeps them per stage placement, as
  arrays, and adds the walk's peaks to them with the same operations in the same order
  as ``rank_at_peak`` (elementwise float64 arithmetic is Python's), so the fullest rank
  is the one ``max(rank_memory(...))`` names; its ``RankMemory`` is then built by
  ``rank_at_peak`` itself.

A ``ShortWalk`` holds arrays, not ``Action`` tuples: the planner keeps hundreds of
walks, and the cycle collector traverses every tuple subclass it holds on each full
collection. Held ZeRO-3 parameters (``hold_params``) depend on the order of opens and
closes per stage; those layouts go through ``rank_memory`` itself, over the walk's
actions rebuilt (``ShortWalk.schedule``). So do the layouts whose backwards gather
parameters and keep them, or whose pipeline runtime frees and gathers whole chunks
(``Layout.fsdp_gathering``), over a walk that is not shortened: a backward, or a chunk
gathered before any pass, can raise the level there, and the short walk keeps only the
states after forwards.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mpsim.results.memory import RankMemory, held_params, rank_at_peak, rank_memory, rank_states, WalkPeak
from mpsim.explore.memwalk import KIND_CODE, ScheduleRead, kept_positions
from mpsim.schedules.actions import Action, Schedule
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.memory import reserved_parts

_KINDS = tuple(sorted(KIND_CODE, key=KIND_CODE.__getitem__))  # F, B, I, W: column 0 to 3 of a stage


class ShortWalk:
    """A schedule's action lists as a matrix of change indexes (module doc).

    ``shell`` is the schedule with no actions (its ranks, placement and chains);
    ``index[rank]`` holds ``4 x stage + kind`` for each action of the rank's list, padded
    with ``4 x stages`` (the table's zero) to the longest list; ``microbatches`` likewise.
    """

    def __init__(self, shell: Schedule, codes: list[np.ndarray], microbatches: list[np.ndarray]):
        self.shell = shell
        width = max((len(row) for row in codes), default=0)
        self.pad = 4 * shell.num_stages
        self.index = np.full((len(codes), width), self.pad, dtype=np.int64)
        self.microbatches = np.zeros((len(codes), width), dtype=np.int64)
        self.lengths = np.array([len(row) for row in codes], dtype=np.int64)
        for rank, (row, numbers) in enumerate(zip(codes, microbatches)):
            self.index[rank, :len(row)] = row
            self.microbatches[rank, :len(row)] = numbers

    @classmethod
    def of(cls, schedule: Schedule, shorten: bool = True, read: ScheduleRead | None = None) -> "ShortWalk":
        """The walk of ``schedule``: shortened as ``memwalk.memory_schedule`` shortens it (the
        same actions, read straight into arrays), or its lists as they are. ``read``: the
        schedule's arrays, where the caller has them."""
        read = read if read is not None else ScheduleRead.of(schedule)
        stage, kind, batch = read.stage, read.kind, read.microbatch
        bounds = np.append(read.starts, read.ends[-1:])
        if shorten:
            keep = kept_positions(stage, kind, schedule.stage_to_rank, read.starts)
            stage, kind, batch = stage[keep], kind[keep], batch[keep]
            bounds = read.bounds(keep)
        codes = 4 * stage + kind
        rows = range(len(read.starts))
        return cls(replace(schedule, actions=tuple(() for _ in schedule.actions)),
                   [codes[bounds[r]:bounds[r + 1]] for r in rows], [batch[bounds[r]:bounds[r + 1]] for r in rows])

    def schedule(self) -> Schedule:
        """The schedule the walk was read from (its actions rebuilt, each item one action)."""
        ranks = []
        for rank in range(len(self.index)):
            count = int(self.lengths[rank])
            ranks.append(tuple(Action(code // 4, _KINDS[code % 4], batch) for code, batch in
                               zip(self.index[rank, :count].tolist(), self.microbatches[rank, :count].tolist())))
        return replace(self.shell, actions=tuple(ranks))


def change_table(workload) -> np.ndarray:
    """The walk's change per ``4 x stage + kind``, as ``walk_peak`` adds them, then one zero."""
    changes = []
    for work in workload.stages:
        a, w = work.activation_bytes, work.weight_grad_buffer_bytes
        changes += [a, -a, w - a, -w]
    return np.array(changes + [0.0], dtype=np.float64)


def walk_peaks(walk: ShortWalk, table: np.ndarray) -> np.ndarray:
    """Per rank, ``walk_peak(...).bytes`` of the walk's lists (0 where a walk never rises above 0)."""
    if walk.index.shape[1] == 0:
        return np.zeros(len(walk.index))
    highest = np.cumsum(table[walk.index], axis=1).max(axis=1)
    return np.where(highest > 0.0, highest, 0.0)  # the loop starts from 0 and keeps only a strict rise


class LayoutMemory:
    """The memory check of one layout (scenario, layout, workload) for any schedule (module doc)."""

    def __init__(self, scenario: Scenario, layout: Layout, workload):
        self.scenario, self.layout, self.workload = scenario, layout, workload
        self.table = change_table(workload)
        self.reserved = reserved_parts(scenario, layout)
        self.reserved_bytes = sum(size for _, size in self.reserved)
        self.fragmentation = scenario.training.memory_fragmentation
        self._placed: dict[tuple, tuple] = {}  # (ranks, stage_to_rank) -> (states, arrays)

    def _states(self, shell: Schedule) -> tuple:
        key = (shell.num_ranks, shell.stage_to_rank)
        placed = self._placed.get(key)
        if placed is None:
            states = rank_states(self.scenario, self.layout, shell.stage_to_rank, shell.num_ranks, self.workload)

            def column(name: str) -> np.ndarray:
                return np.array([getattr(state, name) for state in states], dtype=np.float64)

            model_state = column("weights_bytes") + column("grads_bytes") + column("optimizer_bytes")
            placed = self._placed[key] = (states, model_state, column("state_bytes"), column("buffers_bytes"))
        return placed

    def fullest(self, shell: Schedule, walk: ShortWalk | None = None) -> RankMemory:
        """The ``RankMemory`` of the rank with the highest peak, the first of equals, as
        ``max(rank_memory(...), key=peak_memory_bytes)`` finds it over ``walk``'s lists
        (with no walk: over no actions, the model state and buffers alone). Its forwards in
        flight and what deferred weight gradients hold at the peak are left at 0: the
        planner reads neither."""
        if held_params(self.layout) or self.layout.fsdp_gathering is not None:
            schedule = walk.schedule() if walk is not None else shell
            return max(rank_memory(self.scenario, self.layout, schedule, self.workload, layer_peaks=False),
                       key=lambda m: m.peak_memory_bytes)
        states, model_state, state_bytes, buffers = self._states(shell)
        peaks = walk_peaks(walk, self.table) if walk is not None else np.zeros(len(states))
        # rank_at_peak and RankMemory.peak_memory_bytes, elementwise, in their order
        fragmentation = (state_bytes + peaks + buffers) * self.fragmentation
        totals = model_state + peaks + buffers + self.reserved_bytes + fragmentation
        rank = int(np.argmax(totals))
        peak = float(peaks[rank])
        return rank_at_peak(rank, states[rank], WalkPeak(peak, 0, 0.0, 0.0), self.reserved, self.fragmentation)
