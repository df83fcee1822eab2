"""Transformer Engine's fp8 amax reductions (``mpsim/workload/fp8_scaling.py``), held to TE 1.11's
and Megatron-Core 0.9's code: where they run, what they carry, over which group."""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.cost.collectives import collective_time
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"  # 80 layers, TP 8, PP 4, 16 microbatches
FP8 = ("training.dtype=fp8",)
# a Llama layer's fp8 GEMMs in Transformer Engine: QKV, the output projection, FC1 (gate and up
# fused) and FC2
GEMMS_PER_LAYER = 4


def workload(*overrides: str):
    scenario = load_scenario(LLAMA70, list(overrides)).scenario
    layout = resolve(scenario)
    return scenario, layout, build_workload(scenario, layout)


def amax_blocks(blocks) -> list:
    return [block for block in blocks if block.label == "fp8 amax"]


def test_each_chunk_reduces_after_its_last_layer_forward_and_its_first_layer_backward():
    _, _, work = workload(*FP8)
    for stage in work.stages:
        labels = [block.label for block in stage.forward]
        last_layer = max(i for i, label in enumerate(labels) if label.startswith("layer "))
        assert labels[last_layer + 1] == "fp8 amax"  # before the LM head's forward, if any
        assert len(amax_blocks(stage.forward)) == 1
        for backward in (stage.backward, stage.backward_input):
            labels = [block.label for block in backward]
            # after the first layer's backward (its recompute block comes before it), then the embedding's
            layer0 = max(i for i, label in enumerate(labels) if label == "layer 0")
            assert labels[layer0 + 1] == "fp8 amax" and labels[layer0 + 2:] in ([], ["embedding"])
            assert len(amax_blocks(backward)) == 1
        assert not amax_blocks(stage.backward_weight)


def test_the_buffer_holds_every_fp8_gemm_of_the_rank():
    """3 forward and 2 backward float32 amaxes per GEMM (TE's fp8 meta), for the rank's 20 layers."""
    _, _, work = workload(*FP8)
    stage = work.stages[1]
    (forward,) = amax_blocks(stage.forward)
    (backward,) = amax_blocks(stage.backward)
    reduce_f = [op for op in forward.items if op.kind == "collective"][0]
    reduce_b = [op for op in backward.items if op.kind == "collective"][0]
    rank_gemms = 80 // 4 * GEMMS_PER_LAYER
    assert reduce_f.message_bytes == rank_gemms * 3 * 4
    assert reduce_b.message_bytes == rank_gemms * 2 * 4
    assert (reduce_f.collective, reduce_f.group) == ("all-reduce", "amax")
    # the concatenation and the scale update, kernels of their own around the all-reduce
    assert [op.kind for op in forward.items] == ["memory", "collective", "memory"]


def test_no_reduction_outside_fp8():
    _, _, work = workload()
    assert not any(amax_blocks(stage.forward) or amax_blocks(stage.backward) for stage in work.stages)


def test_the_group_spans_tensor_context_and_data_parallel_ranks():
    scenario, layout, work = workload(*FP8, "cluster.nodes=16", "parallel.global_batch_size=64")
    assert layout.dp == 4
    model = CostModel(scenario, layout)
    place = model.placements["amax"]
    assert place.size == layout.tp * layout.cp * layout.dp == 32
    (forward,) = amax_blocks(work.stages[1].forward)
    reduce = [op for op in forward.items if op.kind == "collective"][0]
    assert model.collective_s(reduce) == collective_time("all-reduce", reduce.message_bytes, place, model.system)


def test_a_wider_group_makes_the_step_slower_and_shows_in_the_dp_column():
    """The same pipeline replicated over more nodes: only the amax group (and the DP buckets)
    grows; the reductions are exposed, and the summary files them with data parallelism."""
    def run(nodes: int, *overrides: str):
        scenario = load_scenario(LLAMA70, [*FP8, f"cluster.nodes={nodes}",
                                           f"parallel.global_batch_size={16 * nodes // 4}", *overrides]).scenario
        result = simulate(scenario)
        return summarize(result)

    small, large = run(4), run(64)
    amax_small = sum(r.amax_exposed_s for r in small.ranks)
    amax_large = sum(r.amax_exposed_s for r in large.ranks)
    assert 0 < amax_small < amax_large
    assert large.step_time_s > small.step_time_s
    # one reduction a chunk's forward and one its backward, each microbatch: 2 x 16 per rank
    scenario = load_scenario(LLAMA70, list(FP8)).scenario
    result = simulate(scenario)
    model = CostModel(scenario, result.layout)
    (forward,) = amax_blocks(result.workload.stages[1].forward)
    (backward,) = amax_blocks(result.workload.stages[1].backward)
    per_pass = [model.price((block,)).duration_s for block in (forward, backward)]
    rank = summarize(result).ranks[1]
    assert rank.amax_exposed_s == pytest.approx(16 * sum(
        model.collective_s([op for op in block.items if op.kind == "collective"][0]) for block in (forward, backward)))
    assert all(seconds > 0 for seconds in per_pass)
