"""Closed-form pipeline bubbles hold exactly with uniform stages and free communication."""

import pytest

from mpsim.engine import rank_spans, simulate
from mpsim.schedules import build_schedule
from tests.conftest import uniform_input


def bubble_fraction(timeline) -> float:
    end = timeline.pipeline_end_s
    busy = [sum(r.end_s - r.start_s for r in records) for records in timeline.actions]
    return sum(end - b for b in busy) / len(busy) / end


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 16, 32])
def test_gpipe_and_1f1b_bubble(name, p, m):
    schedule = build_schedule(name, p, 1, m, check=True, timer=rank_spans)
    timeline = simulate(uniform_input(schedule, 1.0, 2.0))
    assert bubble_fraction(timeline) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert timeline.pipeline_end_s == pytest.approx((m + p - 1) * 3.0, abs=1e-9)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_interleaved_bubble(p, v, rounds):
    m = p * rounds
    schedule = build_schedule("interleaved-1f1b", p, v, m, check=True)
    # a chunk costs 1/v of a whole stage, as when a stage's layers are split into v chunks
    timeline = simulate(uniform_input(schedule, 1.0 / v, 2.0 / v))
    assert bubble_fraction(timeline) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


def test_bubble_grows_with_transfer_time():
    schedule = build_schedule("1f1b", 4, 1, 8, check=True)
    free = simulate(uniform_input(schedule, transfer_s=0.0)).pipeline_end_s
    slow = simulate(uniform_input(schedule, transfer_s=0.1)).pipeline_end_s
    assert slow > free
