"""One Megatron-Core MoE layer priced by mpsim against NVIDIA's published H100 timings of it.

Megatron-LM's module performance test ``moe_perf``
(``tests/functional_tests/test_cases/common/moe_perf/``: ``test_cases.py`` the shapes,
``__main__.py`` the harness, ``baseline.json`` the timings; github.com/NVIDIA/Megatron-LM,
added in commit cf39a4d, December 2025) times one ``MoELayer`` (router, token dispatcher,
grouped experts, shared expert; no attention, norm or residual) with Transformer Engine's
layers on one DGX H100, EP 8, 4,096 tokens per GPU, bf16, forward and backward each
averaged over 20 iterations with CUDA events, routing forced to balance. Before every
iteration the harness runs a large matmul, so the host is well ahead of the GPU when the
layer starts. A baseline is accepted only when its spread is within 2 % of its mean.

The two shapes, as ``test_cases.py`` writes them:

- Mixtral proxy: hidden 4,096, experts of 14,336, 8 experts, top 2 (one expert per GPU);
- DeepSeek proxy: hidden 7,168, experts of 2,048, 32 experts, top 8 of 8 groups limited to
  4, one shared expert of 2,048, sigmoid router with expert bias.

Both experts are TransformerConfig's default, one GeLU projection, not gated. This script
prices the same layer as a pipeline stage's pass prices it (the MoE block of one layer of
``scenarios/published/dgxc_h100.yaml`` with the recipe framework of ``published_dgxc.py``,
on ``dgx-h100``, its norm and residual add left out) under each dispatcher (``alltoall``,
``deepep``, ``hybridep``; the last two send a token once per node it reaches, HybridEP's
traffic priced by DeepEP's rule). mpsim runs the GEMMs at the H100's clock under a training step's power draw
(``efficiency.sustained_compute``); the harness's GPU alternates a 16 ms fp32 matmul, the
layer and a synchronisation, a clock nobody measured, at most the burst clock, which would
make every priced GEMM faster still. Nothing is fitted to these timings. Last line::

    rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>

Usage: python benchmarks/moe_layer.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_common import print_error_rows  # noqa: E402
from published_dgxc import DGXC_BASE, DGXC_FRAMEWORK  # noqa: E402

from mpsim.cost.actions import CostModel  # noqa: E402
from mpsim.resolve import resolve  # noqa: E402
from mpsim.specs import load_scenario  # noqa: E402
from mpsim.workload.embedding import padded_vocab  # noqa: E402
from mpsim.workload.ops import Block, Op, Overlap  # noqa: E402
from mpsim.workload.stages import build_stage, layer_context, stage_options  # noqa: E402

# test_cases.py: the two proxies' model settings (every case 4,096 tokens, one microbatch, EP 8)
# (TransformerConfig's defaults where the test sets nothing: experts of one GeLU projection, not
# gated, no biases: __main__.py's add_bias_linear=False)
SHAPES = {
    "mixtral": ["model=mixtral-8x7b", "model.hidden_size=4096", "model.moe.expert_ffn_hidden_size=14336",
                "model.moe.num_experts=8", "model.moe.top_k=2", "model.ffn_type=gelu"],
    "deepseek": ["model=deepseek-v3", "model.moe.dense_layers=0", "model.moe.num_experts=32", "model.moe.top_k=8",
                 "model.moe.router_groups=8", "model.moe.router_group_topk=4", "model.moe.shared_experts=1",
                 "model.moe.expert_ffn_hidden_size=2048", "model.moe.shared_expert_ffn_hidden_size=2048",
                 "model.ffn_type=gelu"],
}
DISPATCHERS = {"a2a": "alltoall", "deepep": "deepep", "hybridep": "hybridep"}
# baseline.json at the commit that added the test (ms: forward, backward), bf16 cases
BASELINE_MS = {
    ("mixtral", "a2a"): (4.327, 7.684), ("mixtral", "deepep"): (4.636, 7.854), ("mixtral", "hybridep"): (4.343, 7.741),
    ("deepseek", "a2a"): (7.119, 10.483), ("deepseek", "deepep"): (5.682, 9.055),
    ("deepseek", "hybridep"): (5.391, 8.795),
}
# the MoELayer's own ops: the transformer layer around it owns the norm before and the residual add after
OUTSIDE = ("moe.norm", "moe.bda")


def _ops_of(item) -> list[Op]:
    return [item.comm, *item.compute] if isinstance(item, Overlap) else [item]


def _moe_items(block: Block) -> tuple:
    return tuple(item for item in block.items
                 if all(op.name.startswith("moe.") and not op.name.startswith(OUTSIDE) for op in _ops_of(item)))


def layer_ms(shape: str, dispatcher: str, extra: tuple[str, ...] = ()) -> tuple[float, float]:
    """mpsim's forward and backward milliseconds of the MoE layer."""
    overrides = ["cluster.system=dgx-h100", *SHAPES[shape], "model.num_layers=1", "model.seq_length=4096",
                 "cluster.nodes=1", "parallel.tp=1", "parallel.pp=1", "parallel.vpp=1", "parallel.ep=8",
                 "parallel.schedule=1f1b", "parallel.microbatch_size=1", "parallel.global_batch_size=8",
                 *DGXC_FRAMEWORK, "parallel.sequence_parallel=false", "training.dtype=bf16",
                 f"training.moe_token_dispatcher={DISPATCHERS[dispatcher]}", *extra]
    scenario = load_scenario(DGXC_BASE, overrides).scenario
    layout = resolve(scenario)
    options = stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp))
    # one MoE layer: no dense layer, no embedding, no head
    work, model = build_stage(layer_context(scenario, layout), 1, 0, False, False, options), CostModel(scenario, layout)
    passes = []
    for blocks in (work.forward, work.backward):
        moe = tuple(Block(b.label, b.category, items) for b in blocks if (items := _moe_items(b)))
        passes.append(model.price(moe).duration_s * 1e3)
    return passes[0], passes[1]


def rows() -> list[dict]:
    out = []
    for (shape, dispatcher), (forward, backward) in BASELINE_MS.items():
        predicted = layer_ms(shape, dispatcher)
        for direction, measured, value in zip(("forward", "backward"), (forward, backward), predicted):
            out.append({"label": f"{shape} {dispatcher} bf16 {direction}", "measured_ms": measured,
                        "predicted_ms": value})
    return out


def main() -> int:
    print_error_rows("case", [(row["label"], row["measured_ms"], row["predicted_ms"]) for row in rows()], "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
