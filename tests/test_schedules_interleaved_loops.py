"""The interleaved generators, rewritten for speed, give the schedules of the loops they replaced:
the same actions (as ``Action`` tuples) in the same order, on every rank."""

from __future__ import annotations

from collections import defaultdict

import pytest

from mpsim.schedules.actions import Action
from mpsim.schedules.generators import interleaved_1f1b, interleaved_rounds
from mpsim.schedules.zero_bubble import interleaved_zero_bubble


def _loop_interleaved(pp, vpp, micro, split):
    per_round = interleaved_rounds(pp, micro)
    total = vpp * micro
    ranks = []
    for rank in range(pp):
        warmup = min((vpp - 1) * per_round + (pp - 1 - rank if split else 2 * (pp - 1 - rank)), total)
        counters = defaultdict(int)
        actions, backward_steps, weights_done = [], [], 0

        def emit(stage, kind):
            actions.append(Action(stage, kind, counters[(stage, kind)]))
            counters[(stage, kind)] += 1

        def bwd_stage(step):
            return (vpp - 1 - ((step - warmup) // per_round) % vpp) * pp + rank

        for step in range(total + warmup):
            if step < total:
                emit(((step // per_round) % vpp) * pp + rank, "F")
            if step >= warmup:
                emit(bwd_stage(step), "I" if split else "B")
                backward_steps.append(step)
                if split and step - warmup >= rank:
                    emit(bwd_stage(backward_steps[weights_done]), "W")
                    weights_done += 1
        if split:
            for step in backward_steps[weights_done:]:
                emit(bwd_stage(step), "W")
        ranks.append(tuple(actions))
    return tuple(ranks)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("vpp", [1, 2, 3, 5])
@pytest.mark.parametrize("micro", [1, 2, 4, 6, 8, 12, 16, 24])
def test_interleaved_generators_match_their_loops(pp, vpp, micro):
    try:
        per_round = interleaved_rounds(pp, micro)
    except ValueError:
        pytest.skip("not a multiple of the rounds")
    assert per_round
    zero_bubble = interleaved_zero_bubble(pp, vpp, micro)
    assert zero_bubble.actions == _loop_interleaved(pp, vpp, micro, split=True)
    assert all(type(a) is Action for rank in zero_bubble.actions for a in rank)
    if vpp > 1:
        one_f_one_b = interleaved_1f1b(pp, vpp, micro)
        assert one_f_one_b.actions == _loop_interleaved(pp, vpp, micro, split=False)
        assert all(type(a) is Action for rank in one_f_one_b.actions for a in rank)
