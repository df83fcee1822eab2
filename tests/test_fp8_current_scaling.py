"""Transformer Engine's fp8 current scaling (``training.fp8_recipe: current``) against its delayed
scaling: where the amaxes are taken, what the casts move, which all-reduces run."""

from __future__ import annotations

import pytest

from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.blocks import AMAX_BYTES
from mpsim.workload.ops import Overlap
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"  # TP 8 with sequence parallelism, PP 4
FP8 = ("training.dtype=fp8", "training.transformer_impl=transformer_engine")
CURRENT = (*FP8, "training.fp8_recipe=current")
TP1 = ("parallel.tp=1", "parallel.sequence_parallel=false", "parallel.pp=8", "cluster.nodes=8",
       "parallel.global_batch_size=32")


def middle_layer(*overrides: str):
    scenario = load_scenario(LLAMA70, list(overrides)).scenario
    layout = resolve(scenario)
    stage = build_workload(scenario, layout).stages[1]
    forward = next(block for block in stage.forward if block.label.startswith("layer "))
    backward = next(block for block in stage.backward
                    if block.label.startswith("layer ") and block.category == "backward")
    return scenario, layout, stage, forward, backward


def ops(block):
    for item in block.items:
        yield from (item.comm, *item.compute) if isinstance(item, Overlap) else (item,)


def named(block, name):
    return next(op for op in ops(block) if op.name == name)


def test_no_chunk_end_reductions_under_current_scaling():
    for overrides, expected in ((FP8, True), (CURRENT, False)):
        _, _, stage, _, _ = middle_layer(*overrides)
        assert any(block.label == "fp8 amax" for block in stage.forward) is expected


def test_sequence_parallel_shards_all_reduce_their_amax_over_tp():
    # QKV's and FC1's inputs cast on their shards before the gather, the output projection's and
    # FC2's output gradients the same way in the backward: one float32 all-reduce each
    _, _, _, forward, backward = middle_layer(*CURRENT)
    reductions = [op for op in ops(forward) if op.name.endswith("amax_all_reduce")]
    assert [op.name for op in reductions] == ["attn.qkv.amax_all_reduce", "mlp.fc1.amax_all_reduce"]
    back = [op.name for op in ops(backward) if op.name.endswith("amax_all_reduce")]
    assert back == ["mlp.fc2.dgrad.amax_all_reduce", "attn.proj.dgrad.amax_all_reduce"]
    assert all((op.collective, op.group, op.message_bytes) == ("all-reduce", "tp", AMAX_BYTES) for op in reductions)
    _, _, _, forward, _ = middle_layer(*FP8)
    assert not [op for op in ops(forward) if op.name.endswith("amax_all_reduce")]
    _, _, _, forward, _ = middle_layer(*CURRENT, *TP1)
    assert not [op for op in ops(forward) if op.name.endswith("amax_all_reduce")]


def test_the_casts_read_for_their_amax():
    # without sequence parallelism: the norm writes bf16 with its amax and QKV quantizes it with
    # its transposed copy (read 2, write 1 + 1) where delayed scaling's norm wrote fp8 and the weight
    # gradient transposed it (read 1, write 1); every output gradient is read once more for its amax
    scenario, layout, _, current_f, current_b = middle_layer(*CURRENT, *TP1)
    _, _, _, delayed_f, delayed_b = middle_layer(*FP8, *TP1)
    tokens, hidden = layout.microbatch_size * scenario.model.seq_length, scenario.model.hidden_size
    assert named(current_f, "attn.qkv").cast_bytes == 4 * tokens * hidden
    assert named(delayed_f, "attn.qkv").cast_bytes == 0
    assert named(current_b, "attn.qkv.wgrad").cast_bytes == 0
    assert named(delayed_b, "attn.qkv.wgrad").cast_bytes == 2 * tokens * hidden
    dgrad_c, dgrad_d = named(current_b, "attn.qkv.dgrad"), named(delayed_b, "attn.qkv.dgrad")
    _, m, _, n = dgrad_c.shape  # the dgrad GEMM reads the output gradient, m x n of the forward
    assert dgrad_c.cast_bytes - dgrad_d.cast_bytes == 2 * m * n
    # the output projection casts its bf16 input itself: an amax pass more
    proj_c, proj_d = named(current_f, "attn.proj"), named(delayed_f, "attn.proj")
    assert proj_c.cast_bytes - proj_d.cast_bytes == 2 * proj_c.shape[1] * proj_c.shape[3]


def test_current_scaling_costs_the_step_more_here():
    delayed = summarize(simulate(load_scenario(LLAMA70, list(FP8)).scenario))
    current = summarize(simulate(load_scenario(LLAMA70, list(CURRENT)).scenario))
    assert current.step_time_s > delayed.step_time_s


def test_current_scaling_without_fp8_is_refused():
    with pytest.raises(InputError) as error:
        resolve(load_scenario(LLAMA70, ["training.fp8_recipe=current"]).scenario)
    assert error.value.field == "training.fp8_recipe"
