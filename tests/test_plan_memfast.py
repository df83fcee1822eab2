"""The planner's array walk gives ``results.memory.walk_peak``'s peak to the bit, on random schedules."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mpsim.engine import rank_spans
from mpsim.explore.memfast import CachedWalk
from mpsim.explore.memwalk import memory_schedule
from mpsim.results.memory import walk_peak
from mpsim.schedules import SCHEDULES, ScheduleError, build_schedule

sizes = st.floats(0.0, 1e9, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(SCHEDULES)), st.integers(1, 4), st.integers(1, 3), st.integers(1, 12), st.data())
def test_array_walk_equals_the_loop(name, pp, vpp, micro, data):
    try:
        schedule = build_schedule(name, pp, vpp, micro, check=True, timer=rank_spans)
    except ScheduleError:
        assume(False)
    stages = [SimpleNamespace(activation_bytes=data.draw(sizes), weight_grad_buffer_bytes=data.draw(sizes),
                              layer_activation_bytes=0.0, params=0.0, expert_params=0.0)
              for _ in range(schedule.num_stages)]
    workload = SimpleNamespace(stages=stages)
    walk = CachedWalk(workload)
    for short in (schedule, memory_schedule(schedule)):
        for rank in range(short.num_ranks):
            assert walk(short, rank, workload) == walk_peak(short, rank, workload)


def test_held_parameters_and_other_workloads_go_to_the_loop():
    schedule = build_schedule("1f1b", 2, 1, 4)
    work = SimpleNamespace(activation_bytes=3.0, weight_grad_buffer_bytes=0.0, layer_activation_bytes=1.0,
                           params=5.0, expert_params=0.0)
    workload = SimpleNamespace(stages=[work, work])
    walk = CachedWalk(workload)
    assert walk(schedule, 0, workload, hold_params=True) == walk_peak(schedule, 0, workload, hold_params=True)
    other = SimpleNamespace(stages=[work, SimpleNamespace(**{**vars(work), "activation_bytes": 7.0})])
    assert walk(schedule, 1, other) == walk_peak(schedule, 1, other)
    assert walk(schedule, 1, other).bytes == 7.0  # one forward in flight on the last rank of 1F1B
