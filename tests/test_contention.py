"""Compute beside collectives runs on the SMs they leave it (mpsim/cost/contention.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.cost.actions import CostModel
from mpsim.cost.contention import end_beside, side_by_side_s
from mpsim.cost.step import bucket_sizes, param_gather_exposed_s
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS

LLAMA8 = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
FSDP = ("parallel.tp=1", "parallel.dp=64", "parallel.zero_stage=3", "parallel.sequence_parallel=false",
        "parallel.global_batch_size=64")
NO_SMS = "cluster.system.collective_channels=0"  # collectives that hold no SMs (as on a TPU's DMA engines)


def prepared(*overrides: str):
    s = load_scenario(LLAMA8, list(overrides)).scenario
    layout = resolve(s)
    return build_workload(s, layout), CostModel(s, layout)


def test_compute_alone_runs_at_full_speed():
    assert end_beside(2.0, 3.0, [], 0.2) == 5.0
    assert end_beside(2.0, 3.0, [(0.0, 1.0), (6.0, 9.0)], 0.2) == 5.0  # before and after, never beside
    assert end_beside(2.0, 3.0, [(0.0, 9.0)], 0.0) == 5.0


def test_one_collective_from_the_start_is_side_by_side():
    # the collective ends before the compute: the compute lost its share of SMs for the collective's time
    assert end_beside(0.0, 10.0, [(0.0, 4.0)], 0.25) == pytest.approx(side_by_side_s(10.0, 4.0, 0.25)) == 11.0
    # the collective outlasts the compute: the compute ran at 3/4 speed throughout
    assert end_beside(0.0, 3.0, [(0.0, 8.0)], 0.25) == pytest.approx(4.0)


def test_two_collectives_at_once_hold_their_sms_each():
    one = end_beside(0.0, 10.0, [(0.0, 4.0)], 0.2)
    two = end_beside(0.0, 10.0, [(0.0, 4.0), (0.0, 4.0)], 0.2)
    assert one == pytest.approx(10.8)
    assert two == pytest.approx(11.6)


intervals = st.lists(st.tuples(st.floats(0, 20), st.floats(0, 10)).map(lambda t: (t[0], t[0] + t[1])), max_size=6)


@settings(max_examples=200, deadline=None)
@given(start=st.floats(0, 10), work=st.floats(0, 20), busy=intervals, more=intervals,
       share=st.floats(0, 0.5), more_share=st.floats(0, 0.4))
def test_more_collectives_or_more_sms_held_are_never_faster(start, work, busy, more, share, more_share):
    end = end_beside(start, work, busy, share)
    assert end >= start + work - 1e-9  # never faster than alone
    assert end_beside(start, work, busy + more, share) >= end - 1e-9
    assert end_beside(start, work, busy, min(0.9, share + more_share)) >= end - 1e-9
    # no slower than the whole work at the slowest speed the rule allows
    assert end <= start + work / max(0.05, 1 - len(busy) * share) + 1e-6


def test_fsdp_compute_beside_its_gathers_and_scatters_is_slower():
    held = summarize(simulate(load_scenario(LLAMA8, list(FSDP)).scenario))
    free = summarize(simulate(load_scenario(LLAMA8, [*FSDP, NO_SMS]).scenario))
    assert held.step_time_s > free.step_time_s
    # what the collectives' SMs cost shows as the FSDP gathers' exposed time
    workload, model = prepared(*FSDP)
    _, alone = prepared(*FSDP, NO_SMS)
    forward = workload.stages[0].forward
    assert model.price(forward).dp_exposed_s > alone.price(forward).dp_exposed_s
    assert model.price(forward).duration_s > alone.price(forward).duration_s


def test_param_gather_beside_the_forward_costs_the_sms_it_holds():
    workload, model = prepared("parallel.zero_stage=1")
    _, alone = prepared("parallel.zero_stage=1", NO_SMS)
    work = workload.stages[0]
    assert len(bucket_sizes(work.params, model)) > 1
    held = param_gather_exposed_s(work, model, forward_compute_s=10.0, bucketed=True, aligned=False)
    free = param_gather_exposed_s(work, alone, forward_compute_s=10.0, bucketed=True, aligned=False)
    assert held > free > 0
