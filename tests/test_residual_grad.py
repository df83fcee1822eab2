"""A residual connection's backward: the dropout mask's scaling, and autograd's sum of the
block input's two gradients (through the branch and along the residual)."""

from __future__ import annotations

import pytest

from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.specs.layers import ElementwiseLayer
from mpsim.specs.stack import PlacedLayer
from mpsim.workload import build_workload
from mpsim.workload.layers import StackEnv, layer_work
from mpsim.workload.ops import compute_ops
from tests.conftest import SCENARIOS

GPT = SCENARIOS / "megatron_22b_8xa100.yaml"  # dropout 0.1, TP 8 with sequence parallelism
LLAMA = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"  # no dropout


def layer_ops(path, *overrides: str) -> tuple[dict[str, float], dict[str, float], object, object]:
    """(forward, backward) op bytes by name of one transformer layer, the scenario and its layout."""
    scenario = load_scenario(path, list(overrides)).scenario
    layout = resolve(scenario)
    stage = build_workload(scenario, layout).stages[0]
    label = next(block.label for block in stage.forward if block.label.startswith("layer"))

    def ops(work) -> dict[str, float]:
        return {op.name: op.bytes for block in work if block.label == label for op in compute_ops(block.items)}

    return ops(stage.forward), ops(stage.backward), scenario, layout


@pytest.mark.parametrize("path", [GPT, LLAMA])
def test_each_residual_connection_sums_two_gradients_in_its_backward(path):
    _, backward, scenario, layout = layer_ops(path)
    model = scenario.model
    tokens = layout.microbatch_size * model.seq_length // layout.cp
    if layout.sequence_parallel:
        tokens //= layout.tp
    for block in ("attn", "mlp"):
        # read both gradients, write their sum, on the rank's (sequence-parallel) tokens
        assert backward[f"{block}.bda.residual_grad"] == 3 * tokens * model.hidden_size * 2


def test_dropout_adds_the_mask_scaling_and_no_dropout_has_none():
    _, gpt, scenario, layout = layer_ops(GPT)
    tokens = layout.microbatch_size * scenario.model.seq_length // layout.tp
    assert gpt["attn.bda.grad"] == tokens * scenario.model.hidden_size * (2 * 2 + 1)  # gradient and mask in, out
    _, llama, _, _ = layer_ops(LLAMA)
    assert "attn.bda.grad" not in llama and "mlp.bda.grad" not in llama


def test_a_layer_stack_residual_add_has_the_same_backward():
    env = StackEnv(microbatch_size=2, tp=1, sequence_parallel=False, flash_attention=True)
    add = PlacedLayer(ElementwiseLayer(kind="elementwise", name="residual", op="add"), (), "residual",
                      (128, 64), (128, 64))
    work = layer_work(env, add, "whole")
    assert [op.name for op in work.backward] == ["residual.residual_grad"]
    assert work.backward[0].bytes == 3 * 2 * 128 * 64 * 2


@pytest.mark.parametrize("impl,input_half,weight_half", [
    ("transformer_engine", ["attn.norm.grad"], []),  # one fused pass: dx and the partial dgamma
    ("local", ["attn.norm.grad", "attn.norm.grad_params"], []),  # Apex: its own kernel, in the backward
    ("pytorch", ["attn.norm.grad"], ["attn.norm.grad_params"]),  # native_layer_norm_backward, split by pipelining
])
def test_a_norms_parameter_gradient_is_a_kernel_of_its_own_outside_transformer_engine(impl, input_half, weight_half):
    scenario = load_scenario(GPT, [f"training.transformer_impl={impl}"]).scenario
    layout = resolve(scenario)
    stage = build_workload(scenario, layout).stages[0]
    label = next(block.label for block in stage.forward if block.label.startswith("layer"))

    def names(work) -> list[str]:
        return [op.name for block in work if block.label == label for op in compute_ops(block.items)
                if op.name.startswith("attn.norm.")]

    assert names(stage.backward_input) == input_half
    assert names(stage.backward_weight) == weight_half
    assert sorted(names(stage.backward)) == sorted(input_half + weight_half)
    tokens = layout.microbatch_size * scenario.model.seq_length // layout.tp  # sequence parallel
    ops = {op.name: op.bytes for block in stage.backward if block.label == label for op in compute_ops(block.items)}
    assert ops["attn.norm.grad"] == 3 * tokens * scenario.model.hidden_size * 2  # read x and dy, write dx
    if weight_half or len(input_half) == 2:
        assert ops["attn.norm.grad_params"] == 2 * tokens * scenario.model.hidden_size * 2  # read x and dy
