"""Zero-bubble schedules (Qi et al. 2024): the backward split into ``I`` and ``W``.

The weight gradient ``W`` depends on nothing downstream, so it can wait and fill the
bubbles a pipeline would otherwise idle in. With uniform stage times these schedules
reach the paper's closed forms exactly (the tests check it):

* ZB-H1: 1F1B warm-up, rank ``r`` keeps ``r`` weight gradients pending and runs them in
  the cool-down; bubble ``(p-1)(T_F + T_B - T_W)`` at 1F1B's memory.
* ZB-H2: ``2(p-1-r)`` warm-up forwards fill the start, ``2r`` pending weight gradients
  the end; bubble ``(p-1)(T_F + T_B - 2T_W)`` (zero when the three are equal) at
  ``2p-1`` microbatches of activation memory.
* Interleaved zero bubble: interleaved 1F1B with split backward and one warm-up forward
  per hop (torch's ``ScheduleInterleavedZeroBubble``; with one chunk it is ZB-H1).
* ZB-V: two chunks per rank placed in a V (rank ``r`` holds stages ``r`` and
  ``2p-1-r``), zero bubble when T_F = T_B = T_W at 1F1B's memory (torch's order).

Here ``T_B`` is the input-gradient half, as in the paper.
"""

from __future__ import annotations

from collections import defaultdict

from mpsim.schedules.actions import Action, Schedule
from mpsim.schedules.generators import interleaved_rounds, loop_placement


def v_placement(pp: int) -> tuple[int, ...]:
    """Stage ``s`` of ``2*pp`` on rank ``s`` going down and ``2*pp-1-s`` coming back."""
    return tuple(stage if stage < pp else 2 * pp - 1 - stage for stage in range(2 * pp))


def _split_backward_1f1b(rank: int, warmup: int, num_microbatches: int, pending: int, stage: int) -> list[Action]:
    """One-chunk 1F1B with split backward, keeping ``pending`` weight gradients for later."""
    actions = [Action(stage, "F", mb) for mb in range(min(warmup, num_microbatches))]
    forwards = len(actions)
    waiting: list[int] = []
    for mb in range(num_microbatches):
        if forwards < num_microbatches:
            actions.append(Action(stage, "F", forwards))
            forwards += 1
        actions.append(Action(stage, "I", mb))
        waiting.append(mb)
        if len(waiting) > pending:
            actions.append(Action(stage, "W", waiting.pop(0)))
    actions += [Action(stage, "W", mb) for mb in waiting]
    return actions


def zb_h1(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B's warm-up and memory; rank ``r`` defers ``r`` weight gradients."""
    ranks = tuple(tuple(_split_backward_1f1b(r, pp - 1 - r, num_microbatches, r, r)) for r in range(pp))
    return Schedule("zb-h1", num_microbatches, loop_placement(pp, 1), ranks)


def zb_h2(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """ZB-H2: ``2(p-1-r)`` warm-up forwards and ``2r`` deferred weight gradients per rank."""
    ranks = tuple(tuple(_split_backward_1f1b(r, 2 * (pp - 1 - r), num_microbatches, 2 * r, r))
                  for r in range(pp))
    return Schedule("zb-h2", num_microbatches, loop_placement(pp, 1), ranks)


def interleaved_zero_bubble(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """Interleaved 1F1B with split backward (torch's ZB1P order for several chunks per rank)."""
    per_round = interleaved_rounds(pp, num_microbatches)
    total = vpp * num_microbatches
    make = tuple.__new__  # Action(...) without a named tuple constructor's keyword handling
    ranks = []
    for rank in range(pp):
        warmup = min((vpp - 1) * per_round + (pp - 1 - rank), total)
        # the next microbatch of each stage's F, I and W; the stage of each I so far, whose W follow
        next_f, next_i, next_w = [0] * (pp * vpp), [0] * (pp * vpp), [0] * (pp * vpp)
        backward_stages: list[int] = []
        weights_done = 0
        actions: list[Action] = []
        for step in range(total + warmup):
            if step < total:
                stage = ((step // per_round) % vpp) * pp + rank
                actions.append(make(Action, (stage, "F", next_f[stage])))
                next_f[stage] += 1
            if step >= warmup:
                stage = (vpp - 1 - ((step - warmup) // per_round) % vpp) * pp + rank
                actions.append(make(Action, (stage, "I", next_i[stage])))
                next_i[stage] += 1
                backward_stages.append(stage)
                # rank r keeps r weight gradients pending, as ZB-H1 does
                if step - warmup >= rank:
                    stage = backward_stages[weights_done]
                    actions.append(make(Action, (stage, "W", next_w[stage])))
                    next_w[stage] += 1
                    weights_done += 1
        for stage in backward_stages[weights_done:]:
            actions.append(make(Action, (stage, "W", next_w[stage])))
            next_w[stage] += 1
        ranks.append(tuple(actions))
    return Schedule("interleaved-zb", num_microbatches, loop_placement(pp, vpp), tuple(ranks))


def zbv(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """ZB-V (Qi et al. 2024, Sec. 6) in torch's order; needs exactly two chunks per rank."""
    if vpp != 2:
        raise ValueError(f"zbv places exactly two chunks per rank in a V; set vpp to 2 (got {vpp})")
    # the pattern assumes at least 2p-1 microbatches; extra ones are dropped afterwards
    count = max(2 * pp - 1, num_microbatches)
    ranks = []
    for rank in range(pp):
        down, up = rank, 2 * pp - 1 - rank
        n: dict[tuple[int, str], int] = defaultdict(int)
        actions: list[Action] = []

        def emit(stage: int, *kinds: str) -> None:
            for kind in kinds:
                actions.append(Action(stage, kind, n[(stage, kind)]))
                n[(stage, kind)] += 1

        for _ in range(2 * (pp - rank) - 1):  # warm-up: down the V
            emit(down, "F")
        for _ in range(rank):
            emit(up, "F")
            emit(down, "F")
        for _ in range(pp - rank):  # the turn of the V: the up chunk starts its backwards
            emit(up, "F", "I", "W")
        while n[(up, "F")] < n[(down, "F")] or n[(down, "F")] < count:  # steady state
            if n[(down, "F")] < count:
                emit(down, "F")
            emit(down, "I", "W")
            emit(up, "F", "I", "W")
        for _ in range(rank):  # cool-down: input gradients first, weight gradients fill in
            emit(down, "I")
            emit(up, "I")
        for _ in range(pp - rank):
            emit(down, "I", "W")
        while n[(up, "W")] < n[(up, "I")]:
            emit(up, "W")
        while n[(down, "W")] < n[(down, "I")]:
            emit(down, "W")
        ranks.append(tuple(a for a in actions if a.microbatch < num_microbatches))
    return Schedule("zbv", num_microbatches, v_placement(pp), tuple(ranks))
