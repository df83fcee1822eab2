"""RMSNorm as PyTorch's operators run it eagerly (training.norm_kernel: operators; mpsim/workload/norms.py).

The kernels and bytes mpsim prices are checked against what PyTorch itself dispatches for
torchtitan's RMSNorm module, forward and backward, on the CPU.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.norms import (EAGER_RMSNORM_FORWARD, EAGER_RMSNORM_FP32_WEIGHT_FORWARD,
                                  EAGER_RMSNORM_FP32_WEIGHT_GRAD_INPUT, EAGER_RMSNORM_FP32_WEIGHT_GRAD_WEIGHT,
                                  EAGER_RMSNORM_GRAD_INPUT, EAGER_RMSNORM_GRAD_WEIGHT, EAGER_RMSNORM_SAVED_EXTRA,
                                  FUSED_NORM_BANDWIDTH_SHARE, NATIVE_NORM_BANDWIDTH_SHARE)
from tests.conftest import SCENARIOS, dispatch_counter

LLAMA8 = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
PLAIN = ("training.transformer_impl=pytorch",)
TOKENS, HIDDEN = 64, 256


def dispatched(act_bytes: int, fp32_weight: bool = False) -> dict[str, tuple[int, float]]:
    """{pass: (kernels, bytes per element of the tensors as large as the input)} PyTorch dispatches
    for torchtitan's RMSNorm (torchtitan/models/norms.py) forward and backward, its weight in the
    input's dtype or in fp32 (as Hugging Face's LlamaRMSNorm keeps it in Liger-Kernel's benchmark)."""
    torch = pytest.importorskip("torch")

    class RMSNorm(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.eps, self.weight = 1e-6, torch.nn.Parameter(torch.ones(HIDDEN, dtype=dtype))

        def forward(self, x):
            normed = x.float()
            normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
            return normed.type_as(x) * self.weight

    dtype = {2: torch.bfloat16, 4: torch.float32}[act_bytes]
    norm = RMSNorm(torch.float32 if fp32_weight else dtype)
    x = torch.randn(TOKENS, HIDDEN, dtype=dtype, requires_grad=True)
    grad = torch.randn(TOKENS, HIDDEN, dtype=dtype)
    with dispatch_counter(TOKENS * HIDDEN) as forward:
        y = norm(x)
    with dispatch_counter(TOKENS * HIDDEN) as backward:
        y.backward(grad)
    elements = TOKENS * HIDDEN
    return {"forward": (forward.kernels, forward.bytes / elements),
            "backward": (backward.kernels, backward.bytes / elements)}


def test_the_fp32_weight_form_is_what_pytorch_dispatches():
    counted = dispatched(2, fp32_weight=True)
    assert counted["forward"] == priced(EAGER_RMSNORM_FP32_WEIGHT_FORWARD, 2)
    grad_in, grad_w = priced(EAGER_RMSNORM_FP32_WEIGHT_GRAD_INPUT, 2), priced(EAGER_RMSNORM_FP32_WEIGHT_GRAD_WEIGHT, 2)
    assert counted["backward"] == (grad_in[0] + grad_w[0], grad_in[1] + grad_w[1])


def priced(part: tuple[int, int, int], act_bytes: int) -> tuple[int, float]:
    fixed, per_byte, kernels = part
    return kernels, float(fixed + per_byte * act_bytes)


def test_kernels_and_bytes_are_what_pytorch_dispatches_in_bf16():
    counted = dispatched(2)
    assert counted["forward"] == priced(EAGER_RMSNORM_FORWARD, 2)
    grad_in, grad_w = priced(EAGER_RMSNORM_GRAD_INPUT, 2), priced(EAGER_RMSNORM_GRAD_WEIGHT, 2)
    assert counted["backward"] == (grad_in[0] + grad_w[0], grad_in[1] + grad_w[1])


def norm_ops(*overrides: str) -> dict[str, object]:
    s = load_scenario(LLAMA8, list(overrides)).scenario
    layout = resolve(s)
    stage = build_workload(s, layout).stages[0]
    found = {}
    for passes in (stage.forward, stage.backward):
        for block in passes:
            for item in block.items:
                if getattr(item, "name", "").startswith("attn.norm"):
                    found[item.name] = item
    return found


def test_plain_pytorch_runs_rmsnorm_eagerly_and_norm_kernel_undoes_it():
    eager, fused = norm_ops(*PLAIN), norm_ops(*PLAIN, "training.norm_kernel=fused")
    s = load_scenario(LLAMA8, list(PLAIN)).scenario
    layout = resolve(s)
    elements = layout.microbatch_size * s.model.seq_length * s.model.hidden_size / layout.tp  # sequence parallel
    assert eager["attn.norm"].bytes == pytest.approx(elements * 36)
    assert eager["attn.norm"].launches == 8
    assert fused["attn.norm"].bytes == pytest.approx(elements * 4) and fused["attn.norm"].launches == 1
    assert eager["attn.norm.grad"].bytes == pytest.approx(elements * 88)
    assert eager["attn.norm.grad_params"].bytes == pytest.approx(elements * 8)
    # Megatron's layers keep their fused norms; norm_kernel=operators asks for the eager one there too
    assert norm_ops()["attn.norm"].bytes == pytest.approx(elements * 4)
    assert norm_ops("training.norm_kernel=operators")["attn.norm"].bytes == pytest.approx(elements * 36)
    # PyTorch's native RMSNorm (nn.RMSNorm, F.rms_norm): one kernel each way, at its own measured share
    native = norm_ops(*PLAIN, "training.norm_kernel=pytorch")
    assert native["attn.norm"].bytes == fused["attn.norm"].bytes and native["attn.norm"].launches == 1
    assert native["attn.norm"].bandwidth_share == NATIVE_NORM_BANDWIDTH_SHARE["rmsnorm"][0]
    assert native["attn.norm.grad"].bandwidth_share == NATIVE_NORM_BANDWIDTH_SHARE["rmsnorm"][1]
    assert fused["attn.norm"].bandwidth_share == FUSED_NORM_BANDWIDTH_SHARE[0]


def test_eager_rmsnorm_is_slower_and_keeps_its_fp32_input():
    s_eager = load_scenario(LLAMA8, list(PLAIN)).scenario
    s_fused = load_scenario(LLAMA8, [*PLAIN, "training.norm_kernel=fused"]).scenario
    eager, fused = summarize(simulate(s_eager)), summarize(simulate(s_fused))
    assert eager.step_time_s > fused.step_time_s
    layout = resolve(s_eager)
    work_eager = build_workload(s_eager, layout).stages[0]
    work_fused = build_workload(s_fused, layout).stages[0]
    elements = layout.microbatch_size * s_eager.model.seq_length * s_eager.model.hidden_size / layout.tp
    per_layer = 2 * elements * EAGER_RMSNORM_SAVED_EXTRA  # two norms a layer
    assert work_eager.activation_bytes - work_fused.activation_bytes == pytest.approx(per_layer * work_eager.layers)
    assert CostModel(s_eager, layout).price(work_eager.forward).duration_s > \
        CostModel(s_fused, layout).price(work_fused.forward).duration_s


@pytest.mark.parametrize("scenario, fragments", [
    ("megatron_22b_8xa100.yaml", ("layernorm",)),
    # a layer stack: the line names the LayerNorm layer
    ("vit_h14_32xa100.yaml", ("layernorm", "ln1")),
    # DeepSpeech2's stack normalizes with batchnorm only: operators would price nothing
    ("deepspeech2_8xa100.yaml", ("no layernorm or rmsnorm layer",)),
])
def test_norm_kernel_operators_where_the_model_has_no_rmsnorm_is_one_line(scenario, fragments):
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(SCENARIOS / scenario),
                             "--set", "training.norm_kernel=operators"], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.norm_kernel" in lines[0]
    assert all(fragment in lines[0] for fragment in fragments), lines[0]


def test_plain_pytorch_runs_layernorm_in_its_native_kernel_slower_than_a_fused_one():
    """Under transformer_impl pytorch a LayerNorm model's norms are nn.LayerNorm's kernel, which a published
    sweep measured below the best fused norm: the step is slower than with norm_kernel fused, and the same
    holds for a layer stack's LayerNorm layers (ViT-H/14)."""
    for scenario in (SCENARIOS / "megatron_22b_8xa100.yaml", SCENARIOS / "vit_h14_32xa100.yaml"):
        native = load_scenario(scenario, list(PLAIN)).scenario
        fused = load_scenario(scenario, [*PLAIN, "training.norm_kernel=fused"]).scenario
        explicit = load_scenario(scenario, [*PLAIN, "training.norm_kernel=pytorch"]).scenario
        steps = [summarize(simulate(s)).step_time_s for s in (native, fused, explicit)]
        assert steps[0] > steps[1], scenario.name
        assert steps[0] == steps[2], scenario.name

