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

from collections.abc import Callable

from mpsim.schedules.actions import Action, Schedule
from mpsim.schedules.generators import loop_placement, one_f_one_b
from mpsim.schedules.zb_list import WEIGHT_GRAD_SHARE, Knobs, StageTimes, Timing, list_schedule
from mpsim.schedules.zero_bubble import zb_h1, zb_h2

# Per rank, (start of its first action, end of its last) when action (stage, kind) takes
# action_s[(stage, kind)] seconds and a transfer from stage a to stage b transfer_s[(a, b)].
Timer = Callable[[Schedule, dict[tuple[int, str], float], dict[tuple[int, int], float]], list[tuple[float, float]]]


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


__all__ = ["WEIGHT_GRAD_SHARE", "Knobs", "StageTimes", "Timer", "Timing", "execute", "knob_grid",
           "list_schedule", "search", "zb_1p", "zb_2p", "zb_1p_unit", "zb_2p_unit", "SEARCHED"]

SEARCHED = {"zb-1p": zb_1p, "zb-2p": zb_2p}  # registry name -> search with real stage times
