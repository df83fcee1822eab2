"""Plain PyTorch (``transformer_impl: pytorch``) runs rotary embeddings and gated or squared
FFN activations operator by operator under autograd; fused implementations run one kernel.
The bytes each form moves, its kernels, what it keeps, and the direction of the step time."""

from __future__ import annotations

import pytest

from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import compute_ops
from tests.conftest import SCENARIOS

LAYER = SCENARIOS / "published" / "hopper_layer_h200.yaml"  # Llama 3.1 8B layers in plain PyTorch, one sequence


def layer(impl: str, *overrides: str):
    """(forward ops, backward ops by name of the first transformer layer, the bytes the stage's layers keep
    per microbatch, scenario)."""
    scenario = load_scenario(LAYER, [f"training.transformer_impl={impl}", *overrides]).scenario
    stage = build_workload(scenario, resolve(scenario)).stages[0]
    label = next(block.label for block in stage.forward if block.label.startswith("layer"))

    def ops(work):
        return {op.name: op for block in work if block.label == label for op in compute_ops(block.items)}

    return ops(stage.forward), ops(stage.backward), stage.layer_activation_bytes, scenario


def test_rotary_embedding_in_plain_pytorch_moves_five_times_the_bytes_forward():
    fwd, bwd, _, scenario = layer("pytorch")
    fused_fwd, fused_bwd, _, _ = layer("transformer_engine")
    model = scenario.model
    head_dim = model.hidden_size // model.num_attention_heads
    # one element per token of every query and key head, 2 bytes each
    elements = model.seq_length * (model.num_attention_heads + model.kv_heads) * head_dim
    assert fused_fwd["attn.rope"].bytes == 2 * elements * 2 and fused_fwd["attn.rope"].launches == 1
    assert fwd["attn.rope"].bytes == 10 * elements * 2  # neg, cat, two products and their sum
    assert bwd["attn.rope.grad"].bytes == 15 * elements * 2 and fused_bwd["attn.rope.grad"].bytes == 2 * elements * 2
    assert (fwd["attn.rope"].launches, bwd["attn.rope.grad"].launches) == (10, 18)  # query and key each


def test_swiglu_in_plain_pytorch_runs_its_operators_and_keeps_silus_output():
    fwd, bwd, _, scenario = layer("pytorch")
    fused_fwd, fused_bwd, _, _ = layer("transformer_engine")
    elements = scenario.model.seq_length * scenario.model.ffn_hidden_size  # one FFN column per token
    assert fwd["mlp.act"].bytes == 5 * elements * 2 and fused_fwd["mlp.act"].bytes == 3 * elements * 2
    assert bwd["mlp.act.grad"].bytes == 13 * elements * 2 and fused_bwd["mlp.act.grad"].bytes == 5 * elements * 2
    assert (fwd["mlp.act"].launches, bwd["mlp.act.grad"].launches) == (2, 4)
    # silu's output is kept for the product's backward beside what the fused kernel keeps; the
    # other differences between the two layers (norms, bias, attention) do not depend on the FFN
    for impl, kept in (("pytorch", 4), ("transformer_engine", 3)):
        narrow = layer(impl)[2]
        wide = layer(impl, f"model.ffn_hidden_size={scenario.model.ffn_hidden_size + 256}")[2]
        per_column = (wide - narrow) / (scenario.model.num_layers * scenario.model.seq_length * 256 * 2)
        # both FC1 halves and the product, and in plain PyTorch silu's output too
        assert per_column == pytest.approx(kept)


def test_gelu_costs_the_same_either_way():
    fwd, bwd, _, _ = layer("pytorch", "model.ffn_type=gelu")
    fused_fwd, fused_bwd, _, _ = layer("local", "model.ffn_type=gelu")
    assert fwd["mlp.act"].bytes == fused_fwd["mlp.act"].bytes
    assert bwd["mlp.act.grad"].bytes == fused_bwd["mlp.act.grad"].bytes


def test_plain_pytorch_layers_take_longer_than_fused_ones():
    """More bytes through the same memory: the step can only grow (memory-bound ops take
    bytes over bandwidth), here by the extra traffic of rotary embeddings and SwiGLU."""
    steps = {}
    for impl in ("pytorch", "local"):
        scenario = load_scenario(LAYER, [f"training.transformer_impl={impl}"]).scenario
        steps[impl] = simulate(scenario).timeline.step_time_s
    assert steps["pytorch"] > steps["local"]


def test_megatron_without_its_activation_fusion_runs_the_operators():
    # NeMo's Nemotron-4 recipes turn bias_activation_fusion off: squared ReLU runs as NeMo's
    # torch.pow(relu(x), 2). Forward relu and the power (2 + 2); backward autograd's pow_backward,
    # dy * (2 * r.pow(1)), three kernels (2 + 2 + 3), and relu's threshold_backward (3)
    squared = ("model.ffn_type=squared_relu",)
    fused_fwd, fused_bwd, _, scenario = layer("transformer_engine", *squared)
    fwd, bwd, _, _ = layer("transformer_engine", *squared, "training.bias_activation_fusion=false")
    elements = scenario.model.seq_length * scenario.model.ffn_hidden_size
    assert fused_fwd["mlp.act"].bytes == 2 * elements * 2 and fused_bwd["mlp.act.grad"].bytes == 3 * elements * 2
    assert fwd["mlp.act"].bytes == 4 * elements * 2 and bwd["mlp.act.grad"].bytes == 10 * elements * 2
    assert (fwd["mlp.act"].launches, bwd["mlp.act.grad"].launches) == (2, 4)
    # SwiGLU without the fusion is plain PyTorch's silu and product
    plain_fwd, plain_bwd, _, _ = layer("pytorch")
    unfused_fwd, unfused_bwd, _, _ = layer("transformer_engine", "training.bias_activation_fusion=false")
    assert unfused_fwd["mlp.act"].bytes == plain_fwd["mlp.act"].bytes
    assert unfused_bwd["mlp.act.grad"].bytes == plain_bwd["mlp.act.grad"].bytes


def test_plain_pytorchs_gated_ffn_is_two_projections_of_one_input():
    """Hugging Face's LlamaMLP and torchtitan's FeedForward write the gate and the value as two linears
    (ffn_projections separate, plain PyTorch's default): two GEMMs of the FFN's width with the packed GEMM's
    FLOPs, no cut to undo in the activation's backward (9 elements a column in three kernels, against the
    chunked form's 13 in four), the two input gradients summed by autograd, one weight tensor more for
    AccumulateGrad; what the layer keeps does not change."""
    packed_fwd, packed_bwd, packed_kept, scenario = layer("pytorch")  # the H200 layer's own packed linear
    fwd, bwd, kept, _ = layer("pytorch", "training.ffn_projections=separate")
    tokens, hidden, ffn = scenario.model.seq_length, scenario.model.hidden_size, scenario.model.ffn_hidden_size
    assert packed_fwd["mlp.fc1"].shape == (1, tokens, 2 * ffn, hidden) and "mlp.fc1_up" not in packed_fwd
    assert fwd["mlp.fc1"].shape == fwd["mlp.fc1_up"].shape == (1, tokens, ffn, hidden)
    assert fwd["mlp.fc1"].flops + fwd["mlp.fc1_up"].flops == packed_fwd["mlp.fc1"].flops
    assert bwd["mlp.fc1_up.dgrad"].flops + bwd["mlp.fc1.dgrad"].flops == packed_bwd["mlp.fc1.dgrad"].flops
    assert bwd["mlp.fc1_up.wgrad"].flops + bwd["mlp.fc1.wgrad"].flops == packed_bwd["mlp.fc1.wgrad"].flops
    elements = tokens * ffn
    assert fwd["mlp.act"].bytes == packed_fwd["mlp.act"].bytes == 5 * elements * 2
    assert bwd["mlp.act.grad"].bytes == 9 * elements * 2 and bwd["mlp.act.grad"].launches == 3
    assert bwd["mlp.fc1.grad_sum"].bytes == 3 * tokens * hidden * 2 and "mlp.fc1.grad_sum" not in packed_bwd
    # the chunked halves are strided: their kernels run at the share a published sweep of that form
    # measured; the two projections' outputs are whole tensors, whose kernels no sweep times apart
    from mpsim.workload.mlp import PLAIN_FFN_ACTIVATIONS
    chunked = PLAIN_FFN_ACTIVATIONS["swiglu"].bandwidth_share
    assert (packed_fwd["mlp.act"].bandwidth_share, packed_bwd["mlp.act.grad"].bandwidth_share) == chunked
    assert max(chunked) < 1 and fwd["mlp.act"].bandwidth_share == bwd["mlp.act.grad"].bandwidth_share == 1.0
    assert kept == packed_kept
    # the same parameters in one tensor more: an AccumulateGrad kernel more per microbatch
    separate = load_scenario(LAYER, ["training.ffn_projections=separate"]).scenario
    stages = [build_workload(s, resolve(s)).stages[0] for s in (scenario, separate)]
    assert stages[0].params == stages[1].params
    grads = [sum(1 for block in stage.backward for op in compute_ops(block.items) if op.name.endswith(".accumulate_grad"))
             for stage in stages]
    assert grads[0] > 0 and grads[1] - grads[0] == scenario.model.num_layers


def test_plain_pytorch_defaults_to_two_projections_and_megatron_refuses_them():
    import subprocess
    import sys

    titan = load_scenario(SCENARIOS / "published" / "torchtitan_a100.yaml").scenario
    assert titan.training.separate_ffn_projections
    megatron = load_scenario(SCENARIOS / "llama3_70b_32xh100.yaml").scenario
    assert not megatron.training.separate_ffn_projections
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(SCENARIOS / "llama3_70b_32xh100.yaml"),
                             "--set", "training.ffn_projections=separate"], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.ffn_projections" in lines[0]


def test_a_moe_layers_two_projections_are_two_grouped_gemms_and_two_weight_tensors():
    """DeepSeek-V3's shared expert goes through the dense FFN's code, and its routed experts take
    the same form: under plain PyTorch with two projections each FC1 is two weights (the routed
    ones each one tensor over the experts, as torchtitan's GroupedExperts holds w1 and w3), an
    AccumulateGrad kernel more per dense layer and two more per MoE layer; the routed experts run
    a grouped GEMM for the gate and one for the value, with FC1's FLOPs, and sum their input
    gradients."""
    counts, expert_fc1 = [], []
    for form in ("packed", "separate"):
        scenario = load_scenario(SCENARIOS / "deepseek_v3_2048xh100.yaml",
                                 ["training.transformer_impl=pytorch", "training.dtype=bf16",
                                  f"training.ffn_projections={form}"]).scenario
        stage = build_workload(scenario, resolve(scenario)).stages[1]
        ops = [op for block in stage.backward for op in compute_ops(block.items)]
        counts.append(sum(1 for op in ops if op.name.endswith(".accumulate_grad")))
        forward = [op for block in stage.forward for op in compute_ops(block.items)]
        expert_fc1.append([op for op in forward if op.name.startswith("moe.experts.fc1")])
        moe_layers = sum(1 for block in stage.forward if any(op.name == "moe.experts.fc2"
                                                            for op in compute_ops(block.items)))
    assert counts[0] > 0 and 0 < moe_layers < stage.layers
    assert counts[1] - counts[0] == stage.layers + moe_layers
    (packed,), (gate, value) = expert_fc1[0][:1], expert_fc1[1][:2]
    assert (gate.name, value.name) == ("moe.experts.fc1", "moe.experts.fc1_up")
    batch, tokens, width, hidden = packed.shape
    assert gate.shape == value.shape == (batch, tokens, width // 2, hidden)
    assert gate.flops + value.flops == packed.flops
    assert any(op.name == "moe.experts.fc1.grad_sum" for op in ops)
