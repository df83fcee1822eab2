"""Where a linear layer's bias goes: kernels of their own in Megatron's local layers, GEMM
epilogues in Transformer Engine (``training.transformer_impl``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import compute_ops
from tests.conftest import SCENARIOS

GPT = SCENARIOS / "megatron_22b_8xa100.yaml"  # GPT with linear biases, TP 8


def middle_layer(*overrides: str):
    scenario = load_scenario(GPT, list(overrides)).scenario
    layout = resolve(scenario)
    stage = build_workload(scenario, layout).stages[0]
    layer = next(block for block in stage.forward if block.label.startswith("layer"))
    return scenario, layout, stage, layer.label


def ops_named(work, label: str, suffix: str) -> list:
    return [op for block in work if block.label == label for op in compute_ops(block.items)
            if op.name.endswith(suffix)]


def test_local_layers_add_the_qkv_bias_and_sum_every_bias_gradient_in_kernels_of_their_own():
    scenario, layout, stage, label = middle_layer("training.transformer_impl=local")
    added = ops_named(stage.forward, label, ".bias")
    assert [op.name for op in added] == ["attn.qkv.bias"]
    model = scenario.model
    tokens = layout.microbatch_size * model.seq_length
    width = 3 * model.hidden_size // layout.tp
    assert added[0].bytes == 2 * tokens * width * 2  # the GEMM's output read and written again, bf16
    sums = {op.name for op in ops_named(stage.backward_input, label, ".bias.grad")}
    assert sums == {"attn.qkv.bias.grad", "attn.proj.bias.grad", "mlp.fc1.bias.grad", "mlp.fc2.bias.grad"}
    # the split backward sums them in its input-gradient half, as Megatron's linear backward does
    assert not ops_named(stage.backward_weight, label, ".bias.grad")
    assert {op.name for op in ops_named(stage.backward, label, ".bias.grad")} == sums


def test_transformer_engine_puts_the_biases_in_the_gemm_epilogues():
    _, _, stage, label = middle_layer("training.transformer_impl=transformer_engine")
    assert not ops_named(stage.forward, label, ".bias")
    assert not ops_named(stage.backward, label, ".bias.grad")


def test_a_model_without_biases_has_no_bias_kernels():
    _, _, stage, label = middle_layer("model.linear_bias=false", "training.transformer_impl=local")
    assert not ops_named(stage.forward, label, ".bias")
    assert not ops_named(stage.backward, label, ".bias.grad")


def test_userbuffers_choose_transformer_engine_by_default():
    _, _, stage, label = middle_layer("parallel.sequence_parallel=true", "training.tp_comm_overlap=true")
    assert not ops_named(stage.backward, label, ".bias.grad")
    _, _, stage, label = middle_layer()
    assert ops_named(stage.backward, label, ".bias.grad")


def test_the_bias_kernels_cost_time():
    local = summarize(simulate(load_scenario(GPT, ["training.transformer_impl=local"]).scenario))
    fused = summarize(simulate(load_scenario(GPT, ["training.transformer_impl=transformer_engine"]).scenario))
    assert local.step_time_s > fused.step_time_s


def test_local_layers_cannot_run_fp8():
    scenario = load_scenario(GPT, ["training.dtype=fp8", "training.transformer_impl=local"]).scenario
    with pytest.raises(InputError, match=r"training\.transformer_impl.*dtype: fp8"):
        resolve(scenario)


def test_the_command_line_names_the_field_and_exits_2():
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(GPT), "--set", "training.dtype=fp8",
                             "--set", "training.transformer_impl=local"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "training.transformer_impl" in result.stderr and "Traceback" not in result.stderr


def test_without_the_activation_fusion_local_layers_add_fc1s_bias_in_a_kernel_of_their_own():
    # Megatron's MLP.forward without bias_activation_fusion: intermediate + bias, then the activation
    for impl, fused, expected in (("local", "true", []), ("local", "false", ["mlp.fc1.bias"]),
                                  ("transformer_engine", "false", [])):
        scenario, layout, stage, label = middle_layer(f"training.transformer_impl={impl}",
                                                      f"training.bias_activation_fusion={fused}")
        assert [op.name for op in ops_named(stage.forward, label, "fc1.bias")] == expected
    scenario, layout, stage, label = middle_layer("training.transformer_impl=local", "training.bias_activation_fusion=false")
    (added,) = ops_named(stage.forward, label, "fc1.bias")
    model = scenario.model
    tokens = scenario.parallel.microbatch_size * model.seq_length
    assert added.bytes == 2 * tokens * (model.ffn_hidden_size // layout.tp) * 2  # read and write, bf16
