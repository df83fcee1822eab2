"""The FFN's activation: GeLU, SwiGLU, squared ReLU (Nemotron-4) and ReLU.

FLOPs against PyTorch's own counter on the meta device, the activation kernel's traffic and
saved tensors against what its backward needs, the Hugging Face mapping (``relu2``), and the
shipped Nemotron-4 15B file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from mpsim.specs import load_scenario
from mpsim.specs.hf import from_hf_config
from mpsim.specs.model import TransformerSpec
from mpsim.workload.blocks import LayerContext
from mpsim.workload.flops import _ffn_flops_per_token, model_flops_per_sequence
from mpsim.workload.mlp import FFN_ACTIVATIONS, mlp_block, mlp_items
from mpsim.workload.ops import Op, Overlap
from tests.conftest import ROOT, SCENARIOS

H, F, TOKENS = 64, 256, 32  # a small FFN: hidden, FFN width, tokens of one microbatch


@dataclass(frozen=True)
class ActivationContext(LayerContext):
    """A layer context that names its FFN activation."""

    ffn_activation: str = "gelu"


def context(activation: str, tp: int = 1) -> ActivationContext:
    return ActivationContext(microbatch_size=1, seq_length=TOKENS, hidden=H, heads=4, kv_heads=4, head_dim=16,
                             ffn_hidden=F, gated_ffn=activation == "swiglu", tp=tp, sequence_parallel=False,
                             flash_attention=True, dropout=False, rope=True, ffn_activation=activation)


def ops(items) -> list[Op]:
    out = []
    for item in items:
        if isinstance(item, Overlap):
            out += [item.comm, *item.compute]
        elif item is not None:
            out.append(item)
    return out


def flops(items) -> float:
    return sum(op.flops for op in ops(items))


def transformer(activation: str) -> TransformerSpec:
    return TransformerSpec(name="t", num_layers=1, hidden_size=H, ffn_hidden_size=F, ffn_type=activation,
                           num_attention_heads=4, vocab_size=128, seq_length=TOKENS)


def torch_ffn_flops(square: str) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs PyTorch counts for Linear -> squared ReLU -> Linear on meta tensors."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    class SquaredReluFFN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(H, F, bias=False)  # Nemotron-4 has no biases
            self.fc2 = torch.nn.Linear(F, H, bias=False)

        def forward(self, x):
            y = self.fc1(x)
            y = y.relu() ** 2 if square == "pow" else torch.square(torch.nn.functional.relu(y))
            return self.fc2(y)

    module = SquaredReluFFN().to("meta")
    x = torch.empty(TOKENS, H, device="meta", requires_grad=True)  # inside a network: its input needs a gradient
    with FlopCounterMode(display=False) as forward:
        out = module(x)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    return float(forward.get_total_flops()), float(forward.get_total_flops() + backward.get_total_flops())


@pytest.mark.parametrize("square", ["pow", "torch.square"])
def test_squared_relu_flops_equal_pytorchs_counter_on_meta(square):
    counted_forward, counted_total = torch_ffn_flops(square)
    forward, backward, *_ = mlp_items(context("squared_relu"), "mlp", F)
    assert flops(forward) == counted_forward  # two GEMMs; the activation itself counts nothing
    assert flops(forward) + flops(backward) == counted_total  # input- and weight-gradient GEMMs of both
    # the model-FLOPs formula (the MFU numerator) counts the same per token
    assert _ffn_flops_per_token(transformer("squared_relu"), dense=True) * TOKENS == counted_forward


def test_a_non_gated_ffn_has_one_up_projection():
    gelu, squared, relu, swiglu = (mlp_items(context(a), "mlp", F) for a in ("gelu", "squared_relu", "relu",
                                                                              "swiglu"))
    fc1 = {name: next(op for op in ops(items[0]) if op.name == "mlp.fc1")
           for name, items in (("squared_relu", squared), ("swiglu", swiglu))}
    assert fc1["squared_relu"].flops == 2 * TOKENS * H * F
    assert fc1["swiglu"].flops == 2 * fc1["squared_relu"].flops  # a gate and a value
    assert flops(squared[0]) == flops(gelu[0]) == flops(relu[0]) == pytest.approx(flops(swiglu[0]) * 2 / 3)
    assert squared[4] == gelu[4] == 2 * H * F and swiglu[4] == 3 * H * F  # parameters


def test_activation_kernel_traffic_and_saved_tensors():
    def act(activation):
        forward, backward, _, _, _, saved, *_ = mlp_items(context(activation), "mlp", F)
        fwd = next(op for op in ops(forward) if op.name == "mlp.act")
        bwd = next(op for op in ops(backward) if op.name == "mlp.act.grad")
        return fwd.bytes, bwd.bytes, saved

    elems = TOKENS * F * 2  # one bf16 tensor of the FFN's width
    # squared ReLU reads x and writes y; its backward (2 relu(x) dy) reads x and dy and writes dx;
    # it keeps its input, and FC2 keeps y
    assert act("squared_relu") == (2 * elems, 3 * elems, 2 * elems)
    assert act("squared_relu") == act("gelu")
    # ReLU's backward needs only its output, which FC2 keeps anyway: one tensor less
    assert act("relu")[2] == elems < act("squared_relu")[2] < act("swiglu")[2]


def test_relu_moves_activation_memory_down_and_nothing_else():
    blocks = {a: mlp_block(context(a), bias=False, norm_params=2) for a in ("relu", "squared_relu")}
    assert blocks["relu"].saved_bytes < blocks["squared_relu"].saved_bytes
    assert blocks["relu"].params == blocks["squared_relu"].params
    assert flops(blocks["relu"].forward) == flops(blocks["squared_relu"].forward)


def test_old_model_files_keep_their_ffn():
    for name, ffn, gated in (("gpt3_175b", "gelu", False), ("llama3_8b", "swiglu", True)):
        scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml", [f"model={name}"]).scenario
        assert scenario.model.ffn_type == ffn and scenario.model.ffn_activation == ffn
        assert scenario.model.gated_ffn is gated
    assert set(FFN_ACTIVATIONS) == {"gelu", "swiglu", "squared_relu", "relu"}


def test_nemotron4_15b_model_flops_equal_nemos_formula():
    scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml", ["model=nemotron4-15b"]).scenario
    model = scenario.model
    assert model.ffn_type == "squared_relu" and not model.gated_ffn
    # NeMo's model FLOPs per sequence for GQA models, printed by NVIDIA's DGX Cloud benchmarking
    # READMEs as 3.85e14 for Nemotron4-15B (v25.05): s (12 L h^2 (1 + g/a + s/h) + 12 L h f + 6 h V)
    s, L, h, f, V, g, a = 4096, 32, 6144, 24576, 256000, 8, 48
    nemo = s * (12 * L * h * h * (1 + g / a + s / h) + 12 * L * h * f + 6 * h * V)
    assert model_flops_per_sequence(model) == pytest.approx(nemo, rel=1e-12)
    assert nemo == pytest.approx(3.85e14, rel=0.005)
    # a gated FFN of the same width would count 18 L h f instead of 12 L h f
    gated = model.model_copy(update={"ffn_type": "swiglu"})
    assert model_flops_per_sequence(gated) - model_flops_per_sequence(model) == pytest.approx(s * 6 * L * h * f)


def test_hugging_face_relu2_is_squared_relu():
    config = {"model_type": "nemotron", "hidden_act": "relu2", "hidden_size": 6144, "intermediate_size": 24576,
              "num_attention_heads": 48, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 256000,
              "max_position_embeddings": 4096, "norm_eps": 1e-5, "tie_word_embeddings": False}
    tree = from_hf_config(config, "nemotron", "config.json")
    assert tree["ffn_type"] == "squared_relu" and tree["norm"] == "layernorm" and tree["num_query_groups"] == 8
    assert from_hf_config({k: v for k, v in config.items() if k != "hidden_act"}, "n", "c")["ffn_type"] == \
        "squared_relu"  # NemotronConfig's default
    assert from_hf_config({**config, "model_type": "llama", "hidden_act": "silu"}, "l", "c")["ffn_type"] == "swiglu"
    assert from_hf_config({**config, "model_type": "llama", "hidden_act": "relu"}, "l", "c")["ffn_type"] == "relu"


def test_unknown_hugging_face_activation_is_one_line(tmp_path):
    config = {"model_type": "nemotron", "hidden_act": "relu3", "hidden_size": 64, "intermediate_size": 256,
              "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(SCENARIOS / "llama3_8b_64xh100_dp8.yaml"),
                             "--set", f"model={tmp_path / 'config.json'}"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "config.json" in lines[0] and "hidden_act" in lines[0] and "relu3" in lines[0] and "relu2" in lines[0]
