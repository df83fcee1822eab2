"""FSDP under a pipeline schedule keeps each chunk gathered for the step (Layout.fsdp_whole_step)."""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.cost.step import final_grad_buckets
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.results.memory import rank_memory
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"
BASE = ("parallel.tp=4",)  # TP 4 x PP 4 x DP 2: a pipeline, and two ranks to shard over
HELD = (*BASE, "parallel.zero_stage=3", "parallel.reshard_after_forward=false")


def prepared(*overrides: str):
    s = load_scenario(LLAMA70, list(overrides)).scenario
    layout = resolve(s)
    return s, layout, build_workload(s, layout), CostModel(s, layout)


def gathers(work) -> int:
    return sum(block.gather is not None for passes in (work.forward, work.backward) for block in passes)


def test_under_a_pipeline_no_block_gathers_and_one_reduce_scatter_per_layer_after_the_last_backward():
    _, layout, workload, model = prepared(*HELD)
    assert layout.pp > 1 and layout.fsdp_whole_step and layout.state_zero_stage == 1
    work = workload.stages[1]
    assert gathers(work) == 0
    buckets = final_grad_buckets(work, model)
    scatters = [b for b in buckets if "FSDP grad reduce-scatter" in b[2]]
    assert len(scatters) == work.layers
    assert [b[0] for b in scatters] == pytest.approx([(i + 1) / work.layers for i in range(work.layers)])


@pytest.mark.parametrize("other", [("parallel.reshard_after_forward=true",),
                                   ("parallel.pp=1",)])
def test_resharding_or_no_pipeline_keeps_the_per_microbatch_gathers(other):
    _, layout, workload, _ = prepared(*HELD, *other)
    assert not layout.fsdp_whole_step and layout.state_zero_stage == 3
    assert gathers(workload.stages[0]) > 0


def test_the_step_holds_zero_1_state_and_gathers_once():
    s3, layout, workload, _ = prepared(*HELD)
    s1, layout1, workload1, _ = prepared(*BASE, "parallel.zero_stage=1")
    held = summarize(simulate(s3))
    per_microbatch = summarize(simulate(load_scenario(LLAMA70, [*BASE, "parallel.zero_stage=3"]).scenario))
    assert held.step_time_s < per_microbatch.step_time_s  # one gather per chunk and step, not per microbatch
    memory3 = rank_memory(s3, layout, simulate(s3).schedule, workload)
    memory1 = rank_memory(s1, layout1, simulate(s1).schedule, workload1)
    for a, b in zip(memory3, memory1):
        # unsharded weights and fp32 gradients for the step, the optimizer state sharded: ZeRO-1's
        assert a.weights_bytes == pytest.approx(b.weights_bytes)
        assert a.grads_bytes == pytest.approx(b.grads_bytes)
        assert a.optimizer_bytes == pytest.approx(b.optimizer_bytes)
