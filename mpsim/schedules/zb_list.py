"""The zero-bubble heuristic in simulated time: one candidate schedule of the search.

:func:`list_schedule` runs the heuristic of ``zb_search.py`` for one setting of its
knobs: each stage decides what to run at the moment it becomes free, knowing exactly
which inputs have arrived (stages advance earliest-first, so nothing can still arrive in
the past), and every action is placed at the time the engine would start it. A search
runs it for a grid of knobs, and a long step's search runs millions of these decisions.

The heuristic is written twice. :class:`_ListScheduler` is the reference, plain Python
over the stage's state; ``zb_list_arrays.py`` is the same loop over numpy arrays, which
numba compiles (``mpsim/jit.py``) where it is installed. Both do the same floating-point
operations in the same order, so they build the same lists with the same times to the
bit (``tests/test_zb_search.py`` holds them to it on random stages); without numba the
reference runs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from mpsim.jit import compiled
from mpsim.schedules.actions import Action
from mpsim.schedules.zb_list_arrays import KIND_CODES, STALLED, list_schedule_arrays

# Where the stage's own share is unknown (the registry's unit-time schedules): the fork's
# example setting, mem_f 2, mem_b -1, mem_w -1 (auto_schedule.py), a weight gradient keeping
# half of a forward's activations
WEIGHT_GRAD_SHARE = 0.5


@dataclass(frozen=True)
class StageTimes:
    """Seconds per stage of one microbatch: forward, input gradient, weight gradient; one transfer."""

    forward_s: tuple[float, ...]
    input_grad_s: tuple[float, ...]
    weight_grad_s: tuple[float, ...]
    transfer_s: float = 0.0
    # per stage, the memory one forward holds until its input gradient, and the part of it a
    # pending weight gradient keeps after (any unit; None: 1 and WEIGHT_GRAD_SHARE of it)
    forward_memory: tuple[float, ...] | None = None
    weight_grad_memory: tuple[float, ...] | None = None

    @classmethod
    def uniform(cls, pp: int, forward_s: float, input_grad_s: float, weight_grad_s: float,
                transfer_s: float = 0.0) -> "StageTimes":
        return cls((forward_s,) * pp, (input_grad_s,) * pp, (weight_grad_s,) * pp, transfer_s)

    def memory(self, stage: int) -> tuple[float, float]:
        """(held by a forward, kept by its pending weight gradient) on ``stage``."""
        held = self.forward_memory[stage] if self.forward_memory is not None else 1.0
        kept = self.weight_grad_memory[stage] if self.weight_grad_memory is not None else WEIGHT_GRAD_SHARE * held
        return held, kept

    def memory_change(self, stage: int, kind: str) -> float:
        """How the activations ``stage`` holds change with an action of ``kind``: a forward adds
        what it holds, its input gradient frees all but what the weight gradient keeps, and the
        weight gradient frees that."""
        held, kept = self.memory(stage)
        return held if kind == "F" else kept - held if kind == "I" else -kept

    def memory_cap(self, microbatches: int) -> float:
        """The most a stage may hold when it starts a forward: ``microbatches`` forwards of the
        larger of the first two stages (the fork's ``max_pending_backward * max(f_mem[:2])``),
        to a part in 10^9, and never less than one forward of any stage (so that every stage
        can run). Like the fork's, the limit gates forwards only: an input gradient whose
        weight gradient keeps more than the activations it frees (selective recompute,
        sequence-parallel GEMM inputs) may take a stage past it, as it would under 1F1B."""
        largest = max(self.memory(stage)[0] for stage in range(min(2, self.pp)))
        every = max(self.memory(stage)[0] for stage in range(self.pp))
        return max(microbatches * largest, every) * (1.0 + 1e-9)

    @property
    def pp(self) -> int:
        return len(self.forward_s)

    def duration(self, stage: int, kind: str) -> float:
        table = {"F": self.forward_s, "I": self.input_grad_s, "W": self.weight_grad_s}[kind]
        return table[stage]


@dataclass(frozen=True)
class Knobs:
    """One setting of the heuristic."""

    memory_limit: int  # forwards' worth of activations a stage may hold (StageTimes.memory_cap)
    weight_gap: float  # run a pending W in a gap of at least this many T_W (0: in any gap)
    forward_guard: float  # in the warm-up, hold a forward back if the first input gradient arrives within this many T_F
    ahead: int | None  # at most 2(p-1-stage)+1+ahead forwards without their input gradient (None: no cap)


@dataclass(frozen=True)
class Timing:
    """What running per-stage lists gives."""

    end_s: float  # when the last action of any stage ends
    longest_span_s: float  # the longest first-start to last-end of a stage: the Zero Bubble paper's cost
    peak_pending: tuple[int, ...]  # most microbatches each stage held with their input gradient pending
    peak_held: tuple[int, ...]  # most microbatches each stage held with their weight gradient pending
    # most activation memory each stage held just after a forward, what the limit bounds (StageTimes.memory)
    peak_memory: tuple[float, ...]


def _stage_tables(times: StageTimes) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[float, ...]],
                                               tuple[float, ...]]:
    """What the heuristic reads of ``times`` millions of times in a long search, looked up once
    (the same numbers, so the same schedule): per kind (F, I, W) each stage's seconds and the
    change of its activations, and what a forward holds on each stage."""
    stages = range(times.pp)
    duration_s = {kind: tuple(times.duration(stage, kind) for stage in stages) for kind in KIND_CODES}
    change = {kind: tuple(times.memory_change(stage, kind) for stage in stages) for kind in KIND_CODES}
    return duration_s, change, tuple(times.memory(stage)[0] for stage in stages)


def list_schedule(times: StageTimes, num_microbatches: int, knobs: Knobs) -> tuple[list[list[Action]], Timing]:
    """Per-stage action lists built by the heuristic with ``knobs`` (one stage per rank), and
    their timing: every action is placed at the time the engine would start it. Compiled
    where numba is installed, else the reference (module doc); the same either way."""
    loop = compiled(list_schedule_arrays)
    if loop is None:
        return list_schedule_reference(times, num_microbatches, knobs)
    return _from_arrays(times, num_microbatches, knobs, loop)


def list_schedule_reference(times: StageTimes, num_microbatches: int,
                            knobs: Knobs) -> tuple[list[list[Action]], Timing]:
    """:func:`list_schedule` by the plain-Python reference."""
    return _ListScheduler(times, num_microbatches, knobs).run()


def _from_arrays(times: StageTimes, m: int, knobs: Knobs, loop) -> tuple[list[list[Action]], Timing]:
    """Run the array loop (compiled, or ``list_schedule_arrays`` itself in the tests) and read
    its answer back into lists and a :class:`Timing`."""
    stages = range(times.pp)
    duration_s, change, held = _stage_tables(times)
    ahead = -1 if knobs.ahead is None else knobs.ahead
    status, kinds, microbatches, counts, first_start, last_end, most_pending, most_held, most_memory = loop(
        np.array([duration_s[kind] for kind in KIND_CODES], dtype=np.float64),
        np.array([change[kind] for kind in KIND_CODES], dtype=np.float64), np.array(held, dtype=np.float64),
        float(times.transfer_s), m, float(times.memory_cap(knobs.memory_limit)), ahead, float(knobs.weight_gap),
        float(knobs.forward_guard))
    if status == STALLED:
        raise RuntimeError("zero-bubble search stalled")  # a bug, not bad input (as the reference)
    lists = [[Action(stage, KIND_CODES[kind], mb) for kind, mb in zip(kinds[stage, :counts[stage]].tolist(),
                                                                     microbatches[stage, :counts[stage]].tolist())]
             for stage in stages]
    last = last_end.tolist()
    starts = first_start.tolist()
    timing = Timing(max(last), max(last[s] - (starts[s] if starts[s] == starts[s] else 0.0) for s in stages),
                    tuple(most_pending.tolist()), tuple(most_held.tolist()), tuple(most_memory.tolist()))
    return lists, timing


class _ListScheduler:
    """The heuristic's state while it places actions in simulated time.

    A heap holds, per stage, the time it is next free; the stage popped earliest decides
    what to run then (:meth:`_decide`), knowing exactly which inputs have arrived.
    """

    def __init__(self, times: StageTimes, num_microbatches: int, knobs: Knobs):
        pp, m = times.pp, num_microbatches
        self.times, self.m, self.knobs = times, m, knobs
        self.pp, self.transfer_s = pp, times.transfer_s
        self.duration_s, self.change, self.held = _stage_tables(times)
        self.f_end: list[list[float | None]] = [[None] * m for _ in range(pp)]
        self.i_end: list[list[float | None]] = [[None] * m for _ in range(pp)]
        self.next_f, self.next_i = [0] * pp, [0] * pp
        self.pending_w: list[list[int]] = [[] for _ in range(pp)]
        self.lists: list[list[Action]] = [[] for _ in range(pp)]
        # (time the stage is free, order of arrival, stage): a stage that waits goes behind the
        # others free at the same time, so the one it waits for moves first
        self.clock = [(0.0, stage, stage) for stage in range(pp)]
        heapq.heapify(self.clock)
        self.order = pp
        self.idle_pops = 0  # consecutive waits with nothing later to wake for
        self.last_kind = [""] * pp  # the last F or I each stage ran
        self.idle = [0.0] * pp  # seconds each stage has waited since its first action
        self.most_idle = 0.0  # the largest of them
        self.first_start: list[float | None] = [None] * pp
        self.last_end = [0.0] * pp
        self.most_pending, self.most_held = [0] * pp, [0] * pp
        # activations held now, and at most just after a forward
        self.memory, self.most_memory = [0.0] * pp, [0.0] * pp
        self.cap = times.memory_cap(knobs.memory_limit)

    def run(self) -> tuple[list[list[Action]], Timing]:
        while self.clock:
            now, _, stage = heapq.heappop(self.clock)
            if self.next_i[stage] == self.m:  # forwards and input gradients done: the weight gradients left
                self._append_weight_grads(stage)
            else:
                self._decide(stage, now)
        pp = self.times.pp
        timing = Timing(max(self.last_end), max(self.last_end[s] - (self.first_start[s] or 0.0) for s in range(pp)),
                        tuple(self.most_pending), tuple(self.most_held), tuple(self.most_memory))
        return self.lists, timing

    def _decide(self, stage: int, now: float) -> None:
        """Run a forward, an input gradient or a pending weight gradient at ``now``, or wait."""
        times, knobs, m = self.times, self.knobs, self.m
        next_f, next_i = self.next_f[stage], self.next_i[stage]
        i_at = self._input_grad_arrival(stage, next_i) if next_i < next_f else None
        pending = next_f - next_i  # forwards whose input gradient has not run
        f_open = next_f < m and self.memory[stage] + self.held[stage] <= self.cap and (
            knobs.ahead is None or pending < 2 * (self.pp - 1 - stage) + 1 + knobs.ahead)
        f_at = self._forward_arrival(stage, next_f) if next_f < m else None
        i_ready = i_at is not None and i_at <= now
        guard = knobs.forward_guard * times.forward_s[stage]
        # in the warm-up (before the stage's first input gradient) a forward must not delay
        # the first input gradient by much: it runs the chain every stage waits for
        f_ready = f_open and f_at is not None and f_at <= now and not (
            next_i == 0 and i_at is not None and now < i_at < now + guard)
        # input gradients first (they are on the critical path), except that in 1F1B's
        # rhythm a forward follows each input gradient when it can
        if f_ready and (self.last_kind[stage] == "I" or not i_ready):
            self._place(stage, "F", next_f, now)
            return
        if i_ready:
            self._place(stage, "I", next_i, now)
            return
        soon = [t for t in (i_at, f_at if f_open else None) if t is not None and t > now]
        if self.pending_w[stage]:
            # a forward that has arrived but may not run (the limit) leaves the stage idle too
            blocked = next_f < m and not f_open and f_at is not None and f_at <= now
            gap = min(soon) - now if soon else float("inf")
            # a gap shorter than the knob still gets a W when idling through it would make
            # this stage the one that has idled most (the paper's rule)
            worst = self.idle[stage] + gap > self.most_idle
            if blocked or worst or gap >= knobs.weight_gap * times.weight_grad_s[stage]:
                self._place(stage, "W", self.pending_w[stage].pop(0), now)
                return
        self._wait(stage, now, soon)

    def _forward_arrival(self, stage: int, mb: int) -> float | None:
        """When the input of forward ``mb`` on ``stage`` is there: the previous stage's forward
        and one transfer; None while that forward has not been placed."""
        if stage == 0:
            return 0.0
        end = self.f_end[stage - 1][mb]
        return None if end is None else end + self.transfer_s

    def _input_grad_arrival(self, stage: int, mb: int) -> float | None:
        """When the input of input gradient ``mb`` on ``stage`` is there: the next stage's input
        gradient and one transfer (the last stage's own forward); None while it is unplaced."""
        if stage == self.pp - 1:
            return self.f_end[stage][mb]
        end = self.i_end[stage + 1][mb]
        return None if end is None else end + self.transfer_s

    def _next_other(self, now: float) -> float | None:
        """The earliest time after ``now`` at which another stage is free, if any: the heap is
        walked from its root, and a subtree whose root is after ``now`` is not entered (its root
        is its earliest), so only the stages free at ``now`` and their children are read."""
        clock = self.clock
        size = len(clock)
        best = None
        stack = [0] if size else []
        while stack:
            index = stack.pop()
            at = clock[index][0]
            if at > now:
                if best is None or at < best:
                    best = at
                continue
            left = 2 * index + 1
            if left < size:
                stack.append(left)
                if left + 1 < size:
                    stack.append(left + 1)
        return best

    def _wait(self, stage: int, now: float, soon: list[float]) -> None:
        """Nothing to run now: wake at the next known arrival, or when another stage moves on."""
        other = self._next_other(now)
        later = soon + [other] if other is not None else soon
        self.idle_pops = 0 if later else self.idle_pops + 1
        if self.idle_pops > self.pp + 1:  # every stage waits at the same moment for another
            raise RuntimeError(f"zero-bubble search stalled on stage {stage} at {now}")  # a bug, not bad input
        wake = min(later) if later else now
        if self.next_i[stage] > 0 or self.next_f[stage] > 0:  # idle before the first action is not a bubble
            self.idle[stage] += wake - now
            self.most_idle = max(self.most_idle, self.idle[stage])  # idle times only grow
        self._push(wake, stage)

    def _place(self, stage: int, kind: str, mb: int, start: float) -> None:
        """Run (stage, kind, mb) from ``start`` and note what it changes."""
        end = start + self.duration_s[kind][stage]
        if self.first_start[stage] is None:
            self.first_start[stage] = start
        self.last_end[stage] = end
        if kind != "W":
            self.last_kind[stage] = kind
        self.lists[stage].append(Action(stage, kind, mb))
        self.memory[stage] += self.change[kind][stage]
        if kind == "F":
            self.f_end[stage][mb], self.next_f[stage] = end, mb + 1
            pending = self.next_f[stage] - self.next_i[stage]
            self.most_pending[stage] = max(self.most_pending[stage], pending)
            self.most_held[stage] = max(self.most_held[stage], pending + len(self.pending_w[stage]))
            self.most_memory[stage] = max(self.most_memory[stage], self.memory[stage])
        elif kind == "I":
            self.i_end[stage][mb], self.next_i[stage] = end, mb + 1
            self.pending_w[stage].append(mb)
        self._push(end, stage)

    def _append_weight_grads(self, stage: int) -> None:
        """The stage's remaining weight gradients, back to back after its last input gradient."""
        for mb in self.pending_w[stage]:
            self.lists[stage].append(Action(stage, "W", mb))
            self.last_end[stage] += self.times.weight_grad_s[stage]
        self.pending_w[stage] = []

    def _push(self, at: float, stage: int) -> None:
        self.order += 1
        heapq.heappush(self.clock, (at, self.order, stage))
