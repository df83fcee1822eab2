"""Automatic zero-bubble schedules (ZB-1p, ZB-2p): a search over the heuristic of Qi et al. 2024.

The hand-written ZB-H1 and ZB-H2 are exact only when every stage takes the same time
and transfers are free. The Zero Bubble paper (Sec. 3.1) builds a schedule for the real
times instead: given each stage's T_F, T_B (input gradient), T_W, the time of one
pipeline transfer and a memory limit, it

1. runs as many forwards in the warm-up as the memory limit allows, a knob deciding
   whether a forward may delay an input gradient that is about to arrive;
2. then alternates forwards and input gradients, filling gaps with pending weight
   gradients (a short gap too, when idling through it would make this stage the one
   that has idled most);
3. ends with the weight gradients still pending.

The memory limit is the one the paper's implementation enforces. Its scheduler
(``megatron/core/pipeline_parallel/auto_schedule.py`` in the authors' fork, commit 4769e08)
adds each stage's activation memory per forward (``mem_f``), takes back part of it with
the input gradient (``mem_b``) and the rest with the weight gradient (``mem_w``), and
starts no forward that would take a stage past ``--zero-bubble-max-pending-backward``
times a forward's memory (``zb_schedules.py``: ``max_pending_backward * max(f_mem[:2])``). So a weight
gradient left pending still counts, with the share of the activations it keeps (the
inputs of its GEMMs). ``zb-1p`` allows p forwards' worth, 1F1B's first-stage peak, and
``zb-2p`` 2p. A search that counted only the microbatches waiting for their input
gradient would defer weight gradients without limit and hold far more than 1F1B.

Here the heuristic is list scheduling in simulated time (:func:`list_schedule`): each
stage decides what to run at the moment it becomes free, knowing exactly which inputs
have arrived (stages advance earliest-first, so nothing can still arrive in the past).
:func:`search` tries a grid of the knobs: how large a gap a weight gradient needs, how
close an input gradient must be to hold a warm-up forward back, and how many forwards
may run ahead of their input gradients. It adds ZB-H1, ZB-H2 and 1F1B with split backwards as candidates. Each
candidate is timed with the engine's rules: the heuristic places every action when the
engine would start it, and ZB-H1 and ZB-H2 are timed by a function the caller passes
(:data:`Timer`; the main path and the planner pass the engine's longest-path evaluator,
``mpsim.engine.rank_spans``), since schedules are data and know nothing of the engine.
The search keeps the one within the limit that ends first (the step time; or, to compare
with the paper, whose longest stage span, the paper's cost, is shortest). The paper
refines its heuristic with an ILP; this search does not.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from mpsim.schedules.actions import Action, Schedule
from mpsim.schedules.generators import loop_placement, one_f_one_b
from mpsim.schedules.zero_bubble import zb_h1, zb_h2

# Per rank, (start of its first action, end of its last) when action (stage, kind) takes
# action_s[(stage, kind)] seconds and a transfer from stage a to stage b transfer_s[(a, b)].
Timer = Callable[[Schedule, dict[tuple[int, str], float], dict[tuple[int, int], float]], list[tuple[float, float]]]


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


def list_schedule(times: StageTimes, num_microbatches: int, knobs: Knobs) -> tuple[list[list[Action]], Timing]:
    """Per-stage action lists built by the heuristic with ``knobs`` (one stage per rank), and
    their timing: every action is placed at the time the engine would start it."""
    return _ListScheduler(times, num_microbatches, knobs).run()


class _ListScheduler:
    """The heuristic's state while it places actions in simulated time.

    A heap holds, per stage, the time it is next free; the stage popped earliest decides
    what to run then (:meth:`_decide`), knowing exactly which inputs have arrived.
    """

    def __init__(self, times: StageTimes, num_microbatches: int, knobs: Knobs):
        pp, m = times.pp, num_microbatches
        self.times, self.m, self.knobs = times, m, knobs
        # what the decisions read millions of times in a long search, looked up once: the
        # same numbers ``times`` gives, so the schedule and its times are the same
        self.pp, self.transfer_s = pp, times.transfer_s
        self.duration_s = {kind: tuple(times.duration(stage, kind) for stage in range(pp)) for kind in "FIW"}
        self.change = {kind: tuple(times.memory_change(stage, kind) for stage in range(pp)) for kind in "FIW"}
        self.held = tuple(times.memory(stage)[0] for stage in range(pp))
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


def execute(lists: list[list[Action]], times: StageTimes, timer: Timer) -> Timing:
    """Run per-stage lists in order with fixed durations, timed by ``timer``.

    The peaks only need the order of each list.
    """
    pp = times.pp
    m = max((a.microbatch for actions in lists for a in actions), default=-1) + 1
    schedule = Schedule("candidate", m, loop_placement(pp, 1), tuple(tuple(actions) for actions in lists))
    action_s = {(stage, kind): times.duration(stage, kind) for stage in range(pp) for kind in "FIW"}
    transfer_s = {pair: times.transfer_s for stage in range(pp - 1) for pair in ((stage, stage + 1), (stage + 1, stage))}
    spans = timer(schedule, action_s, transfer_s)
    pending, held, memory = [], [], []
    for stage, actions in enumerate(lists):
        count = {"F": 0, "I": 0, "W": 0}
        most_pending = most_held = 0
        level = most_memory = 0.0
        for action in actions:
            count[action.kind] += 1
            most_pending = max(most_pending, count["F"] - count["I"])
            most_held = max(most_held, count["F"] - count["W"])
            level += times.memory_change(stage, action.kind)
            if action.kind == "F":
                most_memory = max(most_memory, level)
        pending.append(most_pending)
        held.append(most_held)
        memory.append(most_memory)
    return Timing(max(end for _, end in spans), max(end - start for start, end in spans),
                  tuple(pending), tuple(held), tuple(memory))


def _split_1f1b(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """1F1B with each backward run as its input gradient and, right after, its weight gradient:
    within ZB-1p's limit by construction, so the search never ends later than it (the paper's
    ZB-1p is never slower than 1F1B)."""
    plain = one_f_one_b(pp, vpp, num_microbatches)
    ranks = tuple(tuple(part for action in rank for part in (
        (Action(action.stage, "I", action.microbatch), Action(action.stage, "W", action.microbatch))
        if action.kind == "B" else (action,))) for rank in plain.actions)
    return Schedule("1f1b-split", num_microbatches, plain.stage_to_rank, ranks)


def knob_grid(memory_limit: int) -> list[Knobs]:
    """The settings :func:`search` tries (on the paper's setups the best always uses the whole limit)."""
    return [Knobs(memory_limit, gap, guard, ahead) for gap in (0.0, 0.5, 1.0) for guard in (0.0, 0.5, 1.0)
            for ahead in (None, 0, 1, 2)]


def search(times: StageTimes, num_microbatches: int, memory_limit: int, timer: Timer, name: str = "zb-auto",
           objective: str = "end") -> Schedule:
    """The best schedule found in which no forward takes its stage past ``memory_limit``
    forwards' worth of activations, pending weight gradients included (``StageTimes.memory_cap``).

    ``objective`` ``"end"`` ranks candidates by when the last action ends (the step time),
    ``"span"`` by the longest stage span (the Zero Bubble paper's cost); ties go to the
    candidate that keeps fewer microbatches of activations.
    """
    pp = times.pp
    if memory_limit < 1:
        raise ValueError(f"the memory limit must allow at least one microbatch, got {memory_limit}")
    timed = [(timing, lists) for lists, timing in
             (list_schedule(times, num_microbatches, knobs) for knobs in knob_grid(memory_limit))]
    for handmade in (zb_h1, zb_h2, _split_1f1b):
        lists = [list(rank) for rank in handmade(pp, 1, num_microbatches).actions]
        timed.append((execute(lists, times, timer), lists))
    cap = times.memory_cap(memory_limit)
    # the heuristic's own candidates keep to the limit by construction; ZB-H1 and ZB-H2 may not
    fitting = [(timing, lists) for timing, lists in timed
               if all(most <= cap for most in timing.peak_memory)]

    def rank(timing: Timing) -> tuple[float, float, int]:
        first, second = (timing.end_s, timing.longest_span_s) if objective == "end" else \
            (timing.longest_span_s, timing.end_s)
        # times equal to a part in 10^9 are a tie (sums in another order differ in the last bits)
        return round(first, 9), max(timing.peak_held), round(second, 9)

    _, best = min(fitting, key=lambda pair: rank(pair[0]))
    return Schedule(name, num_microbatches, loop_placement(pp, 1), tuple(tuple(rank) for rank in best))


def zb_1p(times: StageTimes, num_microbatches: int, timer: Timer, objective: str = "end") -> Schedule:
    """ZB-1p: at most p forwards' worth of activations per stage, 1F1B's first-stage peak."""
    return search(times, num_microbatches, times.pp, timer, "zb-1p", objective)


def zb_2p(times: StageTimes, num_microbatches: int, timer: Timer, objective: str = "end") -> Schedule:
    """ZB-2p: at most 2p forwards' worth of activations per stage."""
    return search(times, num_microbatches, 2 * times.pp, timer, "zb-2p", objective)


def zb_1p_unit(pp: int, vpp: int, num_microbatches: int, timer: Timer) -> Schedule:
    """ZB-1p searched with unit times and free transfers (``simulate`` searches with the real ones)."""
    return zb_1p(StageTimes.uniform(pp, 1.0, 1.0, 1.0), num_microbatches, timer)


def zb_2p_unit(pp: int, vpp: int, num_microbatches: int, timer: Timer) -> Schedule:
    """ZB-2p searched with unit times and free transfers (``simulate`` searches with the real ones)."""
    return zb_2p(StageTimes.uniform(pp, 1.0, 1.0, 1.0), num_microbatches, timer)


SEARCHED = {"zb-1p": zb_1p, "zb-2p": zb_2p}  # registry name -> search with real stage times
