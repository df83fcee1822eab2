"""Megatron-Core's microbatch groups of its interleaved schedule (parallel.microbatch_group_size)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.schedules import ScheduleError, build_schedule, validate
from mpsim.schedules.generators import interleaved_1f1b, interleaved_rounds, microbatch_group_problem
from mpsim.results.metrics import summarize
from mpsim.results.report import format_summary, summary_dict
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS


def _forward_microbatches(schedule, rank: int) -> list[int]:
    return [action.microbatch for action in schedule.actions[rank] if action.kind == "F"]


def test_megatron_cores_documented_orders():
    # ModelParallelConfig.microbatch_group_size_per_vp_stage's docstring (megatron/core/model_parallel_config.py):
    # PP 2, VP 2, group 2, 4 microbatches: "rank 0 | 0 1 0 1 2 3 2 3"; group 3, 5 microbatches: "0 1 2 0 1 2 3 4 3 4"
    for group, microbatches, order in ((2, 4, [0, 1, 0, 1, 2, 3, 2, 3]), (3, 5, [0, 1, 2, 0, 1, 2, 3, 4, 3, 4])):
        schedule = interleaved_1f1b(2, 2, microbatches, group)
        for rank in range(2):
            assert _forward_microbatches(schedule, rank) == order
        # the chunks alternate by group: stage 0 (chunk 0) for the first group, then stage 2 (chunk 1)
        first = [action.stage for action in schedule.actions[0] if action.kind == "F"][:2 * group]
        assert first == [0] * group + [2] * group


@pytest.mark.parametrize("pp,vpp,microbatches", [(2, 2, 4), (4, 2, 8), (4, 3, 16), (8, 2, 32)])
def test_the_default_group_is_pp_where_pp_divides_the_microbatches(pp, vpp, microbatches):
    assert interleaved_1f1b(pp, vpp, microbatches) == interleaved_1f1b(pp, vpp, microbatches, pp)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 6), vpp=st.integers(2, 4), microbatches=st.integers(2, 30), group=st.integers(1, 30))
def test_every_accepted_group_gives_a_valid_schedule_and_runs_ahead_no_less_with_more(pp, vpp, microbatches, group):
    problem = microbatch_group_problem(pp, microbatches, group)
    if problem is not None:
        with pytest.raises(ScheduleError, match="microbatch_group_size"):
            build_schedule("interleaved-1f1b", pp, vpp, microbatches, microbatch_group_size=group)
        return
    schedule = build_schedule("interleaved-1f1b", pp, vpp, microbatches, check=True, microbatch_group_size=group)
    validate(schedule)  # every action once, dependencies satisfiable
    # Megatron-Core's warm-up: (vpp - 1) x group + 2 (pp - 1 - rank) forwards before the first backward
    for rank, items in enumerate(schedule.actions):
        first_backward = next(i for i, action in enumerate(items) if action.kind == "B")
        assert first_backward == min((vpp - 1) * group + 2 * (pp - 1 - rank) + 1, vpp * microbatches)
    # a larger accepted group never holds fewer forwards in flight on any rank
    for larger in range(group + 1, microbatches + 1):
        if microbatch_group_problem(pp, microbatches, larger) is None:
            other = interleaved_1f1b(pp, vpp, microbatches, larger)
            assert all(_peak_in_flight(b) >= _peak_in_flight(a) for a, b in zip(schedule.actions, other.actions))
            break


def _peak_in_flight(items) -> int:
    held = peak = 0
    for action in items:
        held += 1 if action.kind == "F" else -1
        peak = max(peak, held)
    return peak


def test_a_larger_group_holds_more_activations_in_a_run():
    base = ["parallel.schedule=interleaved-1f1b", "parallel.vpp=2", "parallel.global_batch_size=24"]
    path = SCENARIOS / "llama3_70b_32xh100.yaml"

    def run(*overrides: str):
        return summarize(simulate(load_scenario(path, [*base, *overrides]).scenario))

    grouped = [run(f"parallel.microbatch_group_size={group}") for group in (4, 8, 12)]
    peaks = [max(m.peak_memory_bytes for m in summary.memory) for summary in grouped]
    # each group of 4 more microbatches runs 4 more first-chunk forwards ahead on every rank
    assert peaks[0] < peaks[1] < peaks[2]
    # the default (pp = 4 divides the 24 microbatches) is Megatron-Core's group of pp
    default = run()
    assert default.step_time_s == grouped[0].step_time_s
    assert max(m.peak_memory_bytes for m in default.memory) == peaks[0]
    # the report says which groups ran; the default says nothing
    # (the layout line goes on with the run's recompute, after a semicolon)
    assert re.search(r"schedule interleaved-1f1b in groups of 8(;|\n)", format_summary(grouped[1]))
    assert "in groups of" not in format_summary(default)
    assert summary_dict(grouped[1])["microbatch_group_size"] == 8 and summary_dict(default)["microbatch_group_size"] is None


def test_torchs_even_rounds_stay_the_default_where_pp_does_not_divide():
    # 20 microbatches on 8 ranks: Megatron-Core needs a group to be named (8 leaves 4 over), torch
    # splits them into 2 rounds of 10, which is what the default builds
    assert interleaved_rounds(8, 20) == 10
    assert microbatch_group_problem(8, 20, 8) is not None
    assert interleaved_1f1b(8, 2, 20) == interleaved_1f1b(8, 2, 20, 10)
