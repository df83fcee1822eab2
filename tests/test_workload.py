"""The workload layer reproduces the published formulas it is built on."""

from __future__ import annotations

import pytest

from mpsim.specs import load_scenario, resolve_layout
from mpsim.workload import build_workload
from mpsim.workload.flops import model_flops_per_sequence
from mpsim.workload.memory import layer_activation_bytes
from mpsim.workload.ops import compute_ops
from mpsim.workload.stages import layer_context
from mpsim.workload.transformer import layer_work

SCENARIO = "scenarios/megatron_22b_8xa100.yaml"


def context(*overrides: str):
    scenario = load_scenario(SCENARIO, list(overrides)).scenario
    return scenario, layer_context(scenario, resolve_layout(scenario))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("sp,recompute", [(False, "none"), (True, "none"), (False, "selective"), (True, "selective"),
                                          (False, "full"), (True, "full")])
def test_activation_memory_is_korthikanti_table_2(tp, sp, recompute):
    scenario, ctx = context(f"parallel.tp={tp}", f"parallel.sequence_parallel={str(sp).lower()}",
                            f"parallel.recompute={recompute}", f"cluster.num_devices={tp}", "cluster.nodes=null")
    s, b, h, a, t = 2048, 4, 6144, 64, tp
    sbh = s * b * h
    sp = sp and tp > 1
    expected = {
        ("none", False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): sbh / t * (34 + 5 * a * s / h),
        ("selective", False): sbh * (10 + 24 / t),
        ("selective", True): 34 * sbh / t,
        ("full", False): 2 * sbh,
        ("full", True): 2 * sbh / t,
    }[(recompute, sp)]
    assert layer_activation_bytes(ctx, recompute) == pytest.approx(expected, rel=1e-12)


def pass_flops(items) -> float:
    """FLOPs a pass executes."""
    return sum(op.flops for op in compute_ops(items))


def test_weight_grad_buffer_is_zero_bubble_table_1():
    _, ctx = context("parallel.tp=1", "cluster.num_devices=1", "cluster.nodes=null", "parallel.sequence_parallel=false")
    assert layer_work(ctx).weight_grad_buffer_bytes == pytest.approx(32 * 2048 * 4 * 6144)


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-22b", "megatron-1t"])
def test_model_flops_is_korthikanti_eq_7(name):
    scenario = load_scenario(SCENARIO, [f"model={name}"]).scenario
    m = scenario.model
    s, h, layers, v = m.seq_length, m.hidden_size, m.num_layers, m.vocab_size
    expected = 72 * layers * s * h * h * (1 + s / (6 * h) + v / (12 * h * layers))
    assert model_flops_per_sequence(m) == pytest.approx(expected, rel=1e-12)


def test_model_flops_matches_nemo_for_llama():
    # NVIDIA dgxc READMEs print 4.74e14 model FLOPs per sequence for Llama 3.1 8B at 8K
    scenario = load_scenario("scenarios/llama3_70b_32xh100.yaml", ["model=llama3-8b"]).scenario
    assert model_flops_per_sequence(scenario.model) == pytest.approx(4.74e14, rel=0.01)


def test_layer_gemm_flops_are_24bsh2_per_tp_rank():
    _, ctx = context("parallel.sequence_parallel=false")
    passes = layer_work(ctx)
    s, b, h, t = 2048, 4, 6144, 8
    forward = pass_flops(passes.forward)
    assert forward == pytest.approx(24 * b * s * h * h * (1 + s / (6 * h)) / t, rel=1e-9)
    # the backward does twice the forward's GEMM work; input and weight halves add up
    assert pass_flops(passes.backward) == pytest.approx(2 * forward, rel=1e-9)
    assert pass_flops(passes.backward_input) + pass_flops(passes.backward_weight) == pytest.approx(2 * forward)


def test_stage_params_add_up_to_the_model():
    scenario = load_scenario("scenarios/gpt3_175b_64xa100.yaml").scenario
    layout = resolve_layout(scenario)
    workload = build_workload(scenario, layout)
    total = sum(stage.params for stage in workload.stages) * layout.tp
    h, layers, v, s = 12288, 96, 51200, 2048
    # Narayanan et al. 2021 eq. 2 (the tied LM head is a second copy on the last stage)
    expected = 12 * layers * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h)) + v * h
    assert total == pytest.approx(expected, rel=0.002)
