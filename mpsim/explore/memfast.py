"""The activation walk of ``results.memory.walk_peak`` as array operations, prepared once per schedule.

A rank's walk adds, after each action, a change that depends only on the action's
stage and kind and on the layout's bytes per stage: ``+a`` for a forward, ``-a`` for a
backward, ``w - a`` for an input-gradient pass, ``-w`` for a weight-gradient pass
(``a`` a microbatch's activations, ``w`` the buffer its deferred weight gradient keeps).
So a schedule needs to be read once: per rank, the index of each action's change in a
table of ``4 x stages`` numbers. Each layout then fills the table from its workload,
gathers, and takes a running sum (``numpy.cumsum`` adds in order, like the loop, so the
levels are the loop's to the bit) and its first maximum. The planner walks thousands of
layouts over a few hundred schedules; this is most of its memory check.

Held ZeRO-3 parameters (``hold_params``) depend on the order of opens and closes per
stage; those walks go to ``walk_peak`` itself.
"""

from __future__ import annotations

import numpy as np

from mpsim.results.memory import WalkPeak, walk_peak
from mpsim.schedules.actions import Schedule, flat

_KIND_COLUMN = {"F": 0, "B": 1, "I": 2, "W": 3}
_INDEXES: dict[int, tuple[Schedule, list]] = {}


def _indexes(schedule: Schedule) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank: (change index into the table, forwards-in-flight change, is I/W), cached per schedule."""
    cached = _INDEXES.get(id(schedule))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    ranks = []
    for items in schedule.actions:
        actions = flat(items)
        index = np.fromiter((4 * a.stage + _KIND_COLUMN[a.kind] for a in actions), dtype=np.int64,
                            count=len(actions))
        kinds = index % 4
        ranks.append((index, np.select([kinds == 0, kinds == 3], [1, 0], -1), kinds >= 2))
    if len(_INDEXES) > 4096:  # a few arrays of a short walk each
        _INDEXES.clear()
    _INDEXES[id(schedule)] = (schedule, ranks)
    return ranks


def _table(workload) -> tuple[np.ndarray, np.ndarray]:
    """(level change, weight-gradient buffer change) per 4 x stage + kind, as the walk adds them."""
    changes, for_weight_grads = [], []
    for work in workload.stages:
        a, w = work.activation_bytes, work.weight_grad_buffer_bytes
        changes += [a, -a, w - a, -w]
        for_weight_grads += [0.0, 0.0, w, -w]
    return np.array(changes, dtype=np.float64), np.array(for_weight_grads, dtype=np.float64)


class CachedWalk:
    """``walk_peak`` for one workload, with the schedule's reading cached (module doc)."""

    def __init__(self, workload):
        self.workload = workload
        self.changes, self.for_weight_grads = _table(workload)

    def __call__(self, schedule: Schedule, rank: int, workload, layers_only: bool = False,
                 hold_params: bool = False) -> WalkPeak:
        if hold_params or layers_only or workload is not self.workload:
            return walk_peak(schedule, rank, workload, layers_only, hold_params)
        index, counts, is_weight_grad = _indexes(schedule)[rank]
        if not len(index):
            return WalkPeak(0.0, 0, 0.0, 0.0)
        levels = np.cumsum(self.changes[index])
        top = int(np.argmax(levels))  # the first of the highest: where the loop's strict '>' stops
        if not levels[top] > 0.0:
            return WalkPeak(0.0, 0, 0.0, 0.0)
        in_flight = int(counts[:top + 1].sum())
        held = np.cumsum(self.for_weight_grads[index[:top + 1]][is_weight_grad[:top + 1]])
        return WalkPeak(float(levels[top]), in_flight, 0.0, float(held[-1]) if len(held) else 0.0)
