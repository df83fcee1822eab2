"""The planner's shortened memory walk finds the full walk's activation peak, whatever the bytes."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mpsim.engine import rank_spans
from mpsim.explore.memwalk import memory_schedule
from mpsim.explore.planner import distinct_items
from mpsim.results.memory import activation_walk
from mpsim.schedules import SCHEDULES, ScheduleError, build_schedule
from mpsim.schedules.actions import flat

sizes = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def schedules(draw):
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    low = max(1, getattr(SCHEDULES[name], "min_vpp", 1))
    high = getattr(SCHEDULES[name], "max_vpp", 3) or 3
    pp, vpp, micro = draw(st.integers(1, 6)), draw(st.integers(low, max(low, min(high, 4)))), draw(st.integers(1, 16))
    try:
        return build_schedule(name, pp, vpp, micro, check=True, timer=rank_spans)
    except ScheduleError:
        assume(False)


def workload(draw, stages: int) -> SimpleNamespace:
    return SimpleNamespace(stages=[SimpleNamespace(activation_bytes=draw(sizes), weight_grad_buffer_bytes=draw(sizes),
                                                   layer_activation_bytes=0.0) for _ in range(stages)])


@settings(max_examples=300, deadline=None)
@given(schedules(), st.data())
def test_short_walk_has_the_full_walks_peak(schedule, data):
    work = workload(data.draw, schedule.num_stages)
    short = memory_schedule(schedule)
    for rank in range(schedule.num_ranks):
        full_peak, _ = activation_walk(schedule, rank, work)
        short_peak, _ = activation_walk(short, rank, work)
        assert abs(short_peak - full_peak) <= 1e-9 * max(1.0, full_peak)
        assert len(short.actions[rank]) <= len(flat(schedule.actions[rank]))


def test_short_walk_is_much_shorter_for_a_long_1f1b():
    schedule = build_schedule("1f1b", 8, 1, 256)
    short = memory_schedule(schedule)
    assert sum(len(a) for a in short.actions) * 20 < sum(len(a) for a in schedule.actions)


@settings(max_examples=100, deadline=None)
@given(schedules())
def test_distinct_items_keep_every_duration_key(schedule):
    from mpsim.engine.core import duration_key

    short = distinct_items(schedule)
    assert {duration_key(i) for r in short.actions for i in r} == \
        {duration_key(i) for r in schedule.actions for i in r}
