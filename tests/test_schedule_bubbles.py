"""Closed-form bubbles of the zero-bubble and DualPipe schedules hold with uniform costs."""

from __future__ import annotations

import pytest

from mpsim.engine import EngineInput, rank_spans, simulate
from mpsim.engine.core import duration_key
from mpsim.schedules import Overlapped, build_schedule


def stage_idle(name: str, p: int, v: int, m: int, f: float, i: float, w: float, pair: float | None = None) -> float:
    """Largest (span - busy) over ranks: Zero Bubble's bubble (cost minus compute)."""
    schedule = build_schedule(name, p, v, m, check=True, timer=rank_spans)
    action_s = {}
    for stage in range(schedule.num_stages):
        action_s.update({(stage, "F"): f, (stage, "I"): i, (stage, "W"): w, (stage, "B"): i + w})
    for rank in schedule.actions:
        for item in rank:
            if isinstance(item, Overlapped):
                action_s[duration_key(item)] = f + i + w if pair is None else pair
    timeline = simulate(EngineInput(schedule, action_s, {}))
    return max((r[-1].end_s - r[0].start_s) - sum(x.end_s - x.start_s for x in r) for r in timeline.actions)


TIMES = [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.2, 1.1, 0.7), (2.0, 2.0, 1.0)]


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("rounds", [2, 3, 4])
@pytest.mark.parametrize("f,b,w", TIMES)
def test_zb_h1(p, rounds, f, b, w):
    assert stage_idle("zb-h1", p, 1, rounds * p, f, b, w) == pytest.approx((p - 1) * (f + b - w))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("rounds", [2, 3, 4])
@pytest.mark.parametrize("f,b,w", [t for t in TIMES if t[2] <= t[1]])
def test_zb_h2(p, rounds, f, b, w):
    # the formula assumes W no longer than the other passes (the deferred W fill the tail)
    assert stage_idle("zb-h2", p, 1, rounds * p, f, b, w) == pytest.approx((p - 1) * (f + b - 2 * w))


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("rounds", [2, 3, 4])
def test_1f1b_is_the_reference(p, rounds):
    assert stage_idle("1f1b", p, 1, rounds * p, 1.0, 1.0, 1.0) == pytest.approx((p - 1) * 3.0)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("m_factor", [2, 3, 4])
def test_zbv_has_zero_bubble_when_passes_are_equal(p, m_factor):
    assert stage_idle("zbv", p, 2, m_factor * p, 1.0, 1.0, 1.0) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("m_factor", [2, 3])
def test_dualpipev_matches_deepseek_table(p, m_factor):
    # DeepSeek-V3 Table 2 (PP counted in chunks, 2 per rank): (PP/2 - 1)(F&B + B - 3W) with
    # F = I = W and an F&B step as long as a forward plus a backward
    f = i = w = 1.0
    full_backward = i + w
    pair = f + full_backward
    assert stage_idle("dualpipev", p, 2, m_factor * p, f, i, w) == pytest.approx(
        (p - 1) * (pair + full_backward - 3 * w))


def test_overlapping_shortens_dualpipev():
    plain = stage_idle("dualpipev", 4, 2, 16, 1.0, 1.0, 1.0)
    overlapped = stage_idle("dualpipev", 4, 2, 16, 1.0, 1.0, 1.0, pair=2.5)
    assert overlapped < plain
