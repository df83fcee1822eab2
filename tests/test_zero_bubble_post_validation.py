"""Steps that overlap across stages (benchmarks/zero_bubble_post_validation.py): the repeated
schedule keeps every dependency, 1F1B gains nothing, ZB-2p gains, the period is found."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def script():
    return load_benchmark("zero_bubble_post_validation")


@pytest.fixture(scope="module")
def setup_1p5b(script):
    zb = load_benchmark("published_zero_bubble")
    shapes = zb.setups(script.DATA)
    return lambda schedule: zb.zero_bubble_overrides("1.5B", shapes["1.5B"], 8, 1, 6, 24, schedule)


def test_repeated_schedule_numbers_each_step_on(script):
    from mpsim.schedules import build_schedule
    one = build_schedule("zb-h1", 4, 1, 6)
    three = script.repeated(one, 3)
    assert three.num_microbatches == 18 and three.stage_to_rank == one.stage_to_rank
    for before, after in zip(one.actions, three.actions):
        assert len(after) == 3 * len(before)
        # every action of the three steps once: the microbatches of step j are j * 6 on
        counts = Counter(after)
        assert max(counts.values()) == 1
        assert {a.microbatch // 6 for a in after} == {0, 1, 2}
        assert [a._replace(microbatch=a.microbatch - 6) for a in after[len(before):2 * len(before)]] == list(before)


def test_one_f_one_b_gains_nothing_and_zb_2p_gains(script, setup_1p5b):
    alone, period, steps = script.overlapped_period(setup_1p5b("1F1B"), 6 * 24, 8)
    # rank 0 ends every 1F1B step with its last backward: nothing of the next step can start earlier
    assert period == pytest.approx(alone, rel=1e-9) and steps < 8
    alone, period, steps = script.overlapped_period(setup_1p5b("ZB-2p"), 6 * 24, 8)
    assert period < alone * 0.99 and steps < 8
