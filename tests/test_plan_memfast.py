"""The planner's array memory check gives ``results.memory``'s numbers to the bit: the walk's
peak per rank on random schedules and bytes, and the fullest rank of real layouts."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mpsim.engine import rank_spans
from mpsim.explore.layouts import PlanContext, enumerate_layouts
from mpsim.explore.memfast import LayoutMemory, ShortWalk, change_table, walk_peaks
from mpsim.explore.memwalk import memory_schedule
from mpsim.explore.planbase import apply_fields, base_scenario
from mpsim.resolve import resolve
from mpsim.results.memory import rank_memory, walk_peak
from mpsim.schedules import SCHEDULES, build_schedule
from mpsim.schedules.actions import flat
from mpsim.workload import build_workload
from tests.conftest import TINY_MODEL, registered_schedule

sizes = st.floats(0.0, 1e9, allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(SCHEDULES)), st.integers(1, 4), st.integers(1, 3), st.integers(1, 12), st.data())
def test_array_walk_equals_the_loop(name, pp, vpp, micro, data):
    schedule = registered_schedule(name, pp, vpp, micro)
    stages = [SimpleNamespace(activation_bytes=data.draw(sizes), weight_grad_buffer_bytes=data.draw(sizes))
              for _ in range(schedule.num_stages)]
    workload = SimpleNamespace(stages=stages)
    for short in (schedule, memory_schedule(schedule)):
        peaks = walk_peaks(ShortWalk.of(short, shorten=False), change_table(workload))
        assert list(peaks) == [walk_peak(short, rank, workload).bytes for rank in range(short.num_ranks)]
    assert list(walk_peaks(ShortWalk.of(schedule), change_table(workload))) == list(peaks)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(SCHEDULES)), st.integers(1, 4), st.integers(1, 3), st.integers(1, 10))
def test_a_short_walk_gives_back_its_schedule(name, pp, vpp, micro):
    schedule = registered_schedule(name, pp, vpp, micro)
    short = memory_schedule(schedule)
    rebuilt = ShortWalk.of(schedule).schedule()
    assert rebuilt.actions == tuple(tuple(flat(items)) for items in short.actions)
    assert ShortWalk.of(short, shorten=False).schedule() == rebuilt
    assert (rebuilt.stage_to_rank, rebuilt.chains, rebuilt.num_microbatches) == \
        (schedule.stage_to_rank, schedule.chains, schedule.num_microbatches)


def test_a_walk_that_never_rises_peaks_at_zero():
    schedule = build_schedule("1f1b", 3, 1, 4)
    nothing = SimpleNamespace(stages=[SimpleNamespace(activation_bytes=0.0, weight_grad_buffer_bytes=0.0)] * 3)
    for lists in (schedule, replace(schedule, actions=((), (), ()))):
        assert list(walk_peaks(ShortWalk.of(lists), change_table(nothing))) == [0.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def tiny_layouts(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "gpt_1_3b.yaml"
    path.write_text(TINY_MODEL)
    base = base_scenario(str(path), "dgx-a100", 8, 32)
    context = PlanContext(base, max_microbatch_size=2, max_vpp=2, zero_stages=(0, 1, 3))
    return base, list(enumerate_layouts(context))


# training settings that change what the check adds up: fragmentation, ZeRO-3 parameters
# held from forward to backward (the walk over the actions themselves), a fixed reservation
SETTINGS = ({}, {"training.memory_fragmentation": 0.07}, {"parallel.reshard_after_forward": False},
            {"training.memory_reserved": 3.5e9, "training.memory_fragmentation": 0.5})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fullest_rank_equals_the_reports(tiny_layouts, data):
    base, layouts = tiny_layouts
    fields = {**data.draw(st.sampled_from(layouts)), **data.draw(st.sampled_from(SETTINGS))}
    try:
        scenario = apply_fields(base, fields)
        layout = resolve(scenario)
        schedule = build_schedule(scenario.parallel.schedule, layout.pp, layout.vpp, layout.num_microbatches,
                                  timer=rank_spans)
    except Exception:  # noqa: BLE001 - a layout the rules refuse has no memory to check
        assume(False)
    workload = build_workload(scenario, layout)
    check = LayoutMemory(scenario, layout, workload)
    short = memory_schedule(schedule)
    walk = ShortWalk.of(schedule)
    for lists, checked in ((short, check.fullest(walk.shell, walk)), (walk.shell, check.fullest(walk.shell))):
        expected = max(rank_memory(scenario, layout, lists, workload), key=lambda m: m.peak_memory_bytes)
        assert (checked.rank, checked.peak_memory_bytes, checked.capacity_bytes, checked.largest_category) == \
            (expected.rank, expected.peak_memory_bytes, expected.capacity_bytes, expected.largest_category)
        assert checked.activations_peak_bytes == expected.activations_peak_bytes
