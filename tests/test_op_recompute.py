"""Op-level selective recompute (parallel.recompute: selective-op): torchtitan's per-op policy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import Op, Overlap
from tests.conftest import SCENARIOS

TITAN = SCENARIOS / "published" / "torchtitan_a100.yaml"
LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"


def stage(base, *overrides: str):
    s = load_scenario(base, list(overrides)).scenario
    return build_workload(s, resolve(s)).stages[0], s


def recompute_ops(work) -> list[Op]:
    blocks = [b for b in work.backward if b.category == "recompute"]
    assert blocks
    first = blocks[0].label
    ops: list[Op] = []
    for item in (i for b in blocks if b.label == first for i in b.items):
        ops.extend(item.compute + (item.comm,) if isinstance(item, Overlap) else (item,))
    return ops


def test_a_llama_layer_recomputes_the_key_output_and_up_projections_and_keeps_the_rest():
    work, s = stage(TITAN, "parallel.recompute=selective-op")
    m = s.model
    h, d, kv, ffn = m.hidden_size, m.dim_per_head, m.num_query_groups, m.ffn_hidden_size
    tokens = s.parallel.microbatch_size * m.seq_length
    gemms = [op for op in recompute_ops(work) if op.kind == "gemm"]
    # the second, fourth and sixth matmul of the block: key (h -> kv x d), output (h -> h), up (h -> ffn)
    assert sorted(op.flops for op in gemms) == sorted(2.0 * tokens * h * n for n in (kv * d, h, ffn))
    assert not any(op.kind == "attention" for op in recompute_ops(work))  # flash attention's output is kept
    # kept per layer: its input, the query, value and gate outputs, attention's output and
    # log-sum-exp (fp32 per head and token), the down projection's output (bf16)
    e = 2
    kept = tokens * (h * e + h * e + kv * d * e + h * e + m.num_attention_heads * 4 + ffn * e + h * e)
    layers = [b for b in work.forward if b.label.startswith("layer")]
    assert work.layer_activation_bytes / len(layers) == pytest.approx(kept)


def test_op_recompute_sits_between_none_and_full_in_memory_and_time():
    memory, time = {}, {}
    for mode in ("none", "selective-op", "full"):
        work, s = stage(TITAN, f"parallel.recompute={mode}", "model=llama3-8b")
        memory[mode] = work.layer_activation_bytes
        time[mode] = summarize(simulate(s)).step_time_s
    assert memory["full"] < memory["selective-op"] < memory["none"]
    assert time["none"] < time["selective-op"] < time["full"]


def test_tensor_parallel_op_recompute_gathers_its_input_again_and_keeps_the_reduce_scatters():
    work, s = stage(LLAMA70, "parallel.recompute=selective-op", "training.tp_comm_overlap=false")
    assert s.parallel.tp > 1 and s.parallel.sequence_parallel
    collectives = [op.collective for op in recompute_ops(work) if op.kind == "collective"]
    assert collectives.count("all-gather") == 2 and "reduce-scatter" not in collectives


@pytest.mark.parametrize("overrides,fragment", [
    (["model=gpt3-175b"], "linear_bias"),
    (["model=mixtral-8x7b"], "model.moe"),
])
def test_op_recompute_where_its_pattern_does_not_hold_is_one_line(overrides, fragment):
    sets = [x for o in [*overrides, "parallel.recompute=selective-op"] for x in ("--set", o)]
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(LLAMA70), *sets],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "parallel.recompute" in lines[0] and fragment in lines[0]


def test_pytorchs_own_checkpointing_recomputes_the_matmuls_mpsim_names():
    """torchtitan's policy run by torch.utils.checkpoint on a Llama block on the CPU: the
    matmuls the backward runs again (a forward matmul multiplies by a transposed weight; the
    backward's own take the weight as it is, or no weight) are the key, output and up projections."""
    torch = pytest.importorskip("torch")
    from collections import defaultdict

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    h, kv, ffn, heads = 48, 16, 80, 6
    d = h // heads
    torch.manual_seed(0)
    layers = {name: torch.nn.Linear(i, o, bias=False) for name, (i, o) in {
        "wq": (h, h), "wk": (h, kv), "wv": (h, kv), "wo": (h, h), "w1": (h, ffn), "w3": (h, ffn),
        "w2": (ffn, h)}.items()}
    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default}

    def policy_for(meta):  # torchtitan's (parallelize_llama.py at 157a12c)
        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                meta[f"{mode}_mm_count"] += 1
            keep = func in save and not (func == torch.ops.aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
        return policy

    class ForwardMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func == torch.ops.aten.mm.default:
                for name, layer in layers.items():
                    w = layer.weight
                    if args[1].data_ptr() == w.data_ptr() and args[1].stride() == w.t().stride():
                        self.names.append(name)
            return func(*args, **(kwargs or {}))

    def block(x):
        a = torch.nn.functional.rms_norm(x, (h,))
        b, s = x.shape[:2]
        q = layers["wq"](a).view(b, s, heads, d).transpose(1, 2)
        k = layers["wk"](a).view(b, s, kv // d, d).transpose(1, 2).repeat_interleave(heads * d // kv, 1)
        v = layers["wv"](a).view(b, s, kv // d, d).transpose(1, 2).repeat_interleave(heads * d // kv, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + layers["wo"](o.transpose(1, 2).reshape(b, s, h))
        f = torch.nn.functional.rms_norm(x, (h,))
        return x + layers["w2"](torch.nn.functional.silu(layers["w1"](f)) * layers["w3"](f))

    x = torch.randn(2, 8, h, requires_grad=True)
    forward = ForwardMatmuls()
    with forward:
        out = checkpoint(block, x, use_reentrant=False,
                         context_fn=lambda: create_selective_checkpoint_contexts(policy_for(defaultdict(int))))
    assert forward.names == ["wq", "wk", "wv", "wo", "w1", "w3", "w2"]  # the order the policy counts
    backward = ForwardMatmuls()
    with backward:
        out.sum().backward()
    assert sorted(backward.names) == ["w3", "wk", "wo"]
