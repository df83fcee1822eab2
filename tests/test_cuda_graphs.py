"""Megatron-Core's per-layer CUDA graphs (``training.cuda_graph_modules``;
``mpsim/workload/graphs.py``): a captured part of a layer costs the host one launch per
replay, what follows it eagerly one launch per kernel, and the settings Megatron-Core refuses
are refused here with the field named."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload.embedding import padded_vocab
from mpsim.workload.ops import Op, Overlap
from mpsim.workload.stages import build_stage, layer_context, stage_options
from tests.conftest import SCENARIOS
from tests.test_moe_host_sync import MIXTRAL, QWEN3

LLAMA = SCENARIOS / "llama3_70b_32xh100.yaml"
# fine-grained experts whose layers wait for the host (tests/test_moe_expert_gemms.py)
HOST_BOUND = (*QWEN3, "training.moe_token_dispatcher=deepep", "training.fp8_recipe=current")


def layer(path, *overrides: str):
    scenario = load_scenario(path, list(overrides)).scenario
    layout = resolve(scenario)
    return build_stage(layer_context(scenario, layout), 1, 0, False, False,
                       stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp)))


def ops(blocks) -> list[Op]:
    out: list[Op] = []
    for block in blocks:
        for item in block.items:
            out += [item.comm, *item.compute] if isinstance(item, Overlap) else [item]
    return out


def host_launches(blocks) -> int:
    return sum(op.host_launches for op in ops(blocks))


def step(path, *overrides: str):
    return summarize(simulate(load_scenario(path, list(overrides)).scenario))


def test_a_captured_attention_is_one_launch_each_way():
    eager = layer(LLAMA)
    graphed = layer(LLAMA, "training.cuda_graph_modules=[attn]")
    attention = [op for op in ops(graphed.forward) if op.graph]
    assert attention and attention[0].graph == "start" and all(op.graph == "in" for op in attention[1:])
    assert all(op.name.startswith("attn") for op in attention)
    # the same kernels, priced the same on the GPU; the host launches the attention once
    assert [op.name for op in ops(eager.forward)] == [op.name for op in ops(graphed.forward)]
    eager_attention = sum(op.host_launches for op in ops(eager.forward) if op.name.startswith("attn"))
    assert host_launches(eager.forward) - host_launches(graphed.forward) == eager_attention - 1
    for blocks in (graphed.backward, graphed.backward_input):
        # the layer's backward, and the attention core its selective recompute runs again first
        assert [sum(op.graph == "start" for op in ops([block])) for block in blocks] == [1, 1]
        assert [block.category for block in blocks] == ["recompute", "backward"]


def test_the_router_graph_holds_the_norm_router_and_shared_experts_not_the_dispatch():
    work = layer(MIXTRAL, "training.cuda_graph_modules=[attn,moe_router]")
    graphed = {op.name for op in ops(work.forward) if op.graph}
    assert {"moe.norm", "moe.router", "moe.topk"} <= graphed
    assert not graphed & {"moe.permute", "moe.dispatch_all_to_all", "moe.experts.fc1", "moe.combine_all_to_all"}
    with_preprocess = layer(MIXTRAL, "training.cuda_graph_modules=[attn,moe_router,moe_preprocess]")
    permute = next(op for op in ops(with_preprocess.forward) if op.name == "moe.permute")
    # captured, the counts' copy ends the graph: the host waits for all of it, the permutation's end
    assert permute.graph == "in" and permute.host_waits == "end"
    assert next(op for op in ops(work.forward) if op.name == "moe.permute").host_waits == "start"


def test_a_padded_moe_block_is_captured_whole():
    work = layer(MIXTRAL, "model.moe.capacity_factor=1.25", "training.moe_pad_to_capacity=true",
                 "training.cuda_graph_modules=[moe]")
    moe = [op for op in ops(work.forward) if op.name.startswith("moe.")]
    assert moe[0].graph == "start" and all(op.graph == "in" for op in moe[1:])
    assert not any(op.host_waits for op in moe)


def test_capturing_what_the_gpu_waits_for_shortens_the_step_and_the_rest_remains():
    """Where each pass starts on an empty queue (a synchronisation between passes), the
    attention's and the router's launches show, and their graphs take them away; where the GPU
    waits after the dispatch, for the experts' launches, which no graph covers, most of the wait
    remains, as Megatron Bridge found graphs of the attention, router and preprocessing no faster
    than eager on Qwen3-30B-A3B (docs/training/cuda-graphs.md)."""
    synced = (*HOST_BOUND, "training.host_sync_between_passes=true")
    eager = step(MIXTRAL, *synced)
    attention = step(MIXTRAL, *synced, "training.cuda_graph_modules=[attn]")
    router = step(MIXTRAL, *synced, "training.cuda_graph_modules=[attn,moe_router]")
    assert router.step_time_s <= attention.step_time_s < eager.step_time_s
    assert router.host_wait_s <= attention.host_wait_s < eager.host_wait_s
    ahead, ahead_graphed = step(MIXTRAL, *HOST_BOUND), step(MIXTRAL, *HOST_BOUND,
                                                             "training.cuda_graph_modules=[attn,moe_router]")
    assert 0.9 * ahead.host_wait_s < ahead_graphed.host_wait_s <= ahead.host_wait_s
    # a dense layer whose GPU work outlasts its launches gains nothing, and loses nothing
    dense, dense_graphed = step(LLAMA), step(LLAMA, "training.cuda_graph_modules=[attn,mlp]")
    assert dense_graphed.step_time_s == pytest.approx(dense.step_time_s, rel=1e-3)
    assert dense_graphed.step_time_s <= dense.step_time_s + 1e-12


@pytest.mark.parametrize("path,overrides,message", [
    (MIXTRAL, ("training.cuda_graph_modules=[moe_preprocess]",), "with moe_router"),
    (MIXTRAL, ("training.cuda_graph_modules=[mlp]",), "every layer of the model is a MoE layer"),
    (MIXTRAL, ("training.cuda_graph_modules=[moe]",), "moe_pad_to_capacity"),
    (MIXTRAL, ("model.moe.capacity_factor=1.25", "training.moe_pad_to_capacity=true",
               "training.cuda_graph_modules=[moe,moe_router]"), "choose one"),
    (MIXTRAL, ("model.moe.capacity_factor=1.25", "training.cuda_graph_modules=[moe_router,moe_preprocess]"),
     "capacity factor"),
    (LLAMA, ("training.cuda_graph_modules=[moe_router]",), "the model has none"),
    (LLAMA, ("parallel.recompute=full", "training.cuda_graph_modules=[attn]"), "recompute"),
    (LLAMA, ("training.transformer_impl=pytorch", "training.cuda_graph_modules=[attn]"), "transformer_impl"),
])
def test_what_megatron_core_refuses_names_the_field(path, overrides, message):
    with pytest.raises(InputError) as raised:
        resolve(load_scenario(path, list(overrides)).scenario)
    assert raised.value.field == "training.cuda_graph_modules" and message in str(raised.value)


def test_a_refused_module_is_one_line_and_exit_code_2():
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(LLAMA), "--set",
                             "training.cuda_graph_modules=[moe_router]"], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.cuda_graph_modules" in lines[0] and "Traceback" not in result.stderr
