"""Which ops to measure: the compute ops mpsim prices for a scenario, at its shapes.

The list comes from mpsim's own workload (``build_workload``), so the microbenchmarks
measure exactly the (GEMM shape, operand layout), (attention direction, FLOPs) and
(memory op name, bytes) keys the cost model will look up. Each op travels to the
workers as a plain dict with the layer shapes (:class:`OpContext`) that the PyTorch
implementation of a memory-bound op needs (a norm over ``[tokens, hidden]``, an
activation over ``[tokens, ffn / tp]``, ...).

No torch here: the parent process builds the list, the workers run it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mpsim.cost.calibrated import gemm_layout
from mpsim.resolve import resolve
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload import build_workload
from mpsim.workload.embedding import padded_vocab
from mpsim.workload.ops import compute_ops

# square GEMMs measured on every device, so the efficiency curve also covers shapes no
# scenario asked for
SWEEP_SIZES = (64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class OpContext:
    """Per-rank layer shapes a PyTorch stand-in for an mpsim op is built from."""

    batch: int  # sequences per microbatch
    seq: int
    tokens: int
    norm_tokens: int  # tokens a norm or residual add sees (1/tp under sequence parallelism)
    hidden: int
    ffn_local: int
    gated: bool
    heads_local: int
    kv_local: int
    head_dim: int
    vocab_local: int
    norm: str
    dropout: float
    bias: bool
    dtype: str


def op_context(scenario: Scenario, layout: Layout) -> OpContext:
    """Layer shapes on one rank of ``layout``."""
    model, tp = scenario.model, layout.tp
    tokens = layout.microbatch_size * model.seq_length
    return OpContext(
        batch=layout.microbatch_size, seq=model.seq_length, tokens=tokens,
        norm_tokens=tokens // tp if layout.sequence_parallel else tokens,
        hidden=model.hidden_size, ffn_local=model.ffn_hidden_size // tp, gated=model.gated_ffn,
        heads_local=model.num_attention_heads // tp, kv_local=model.kv_heads // tp, head_dim=model.dim_per_head,
        vocab_local=padded_vocab(model.vocab_size, tp) // tp, norm=model.norm, dropout=model.dropout,
        bias=model.linear_bias, dtype=scenario.training.dtype)


def op_key(op) -> tuple:
    """The identity of a compute op in a profile (what the cost model looks up)."""
    if op.kind == "gemm":
        return ("gemm", tuple(op.shape), gemm_layout(op.name, op.shape[0]))
    if op.kind == "attention":
        return ("attention", op.direction, round(op.flops))
    return ("memory", op.name, round(op.bytes))


def op_record(op, context: OpContext) -> dict:
    """A compute op as the plain dict a worker measures."""
    return {"kind": op.kind, "name": op.name, "shape": list(op.shape) if op.shape else None,
            "layout": gemm_layout(op.name, op.shape[0]) if op.kind == "gemm" else "",
            "flops": op.flops, "bytes": op.bytes, "direction": op.direction, "context": asdict(context)}


def scenario_ops(scenario: Scenario, both_attention_paths: bool = True) -> list[dict]:
    """Distinct compute ops of a scenario, in first-seen order.

    With ``both_attention_paths`` the other attention path (unfused when the scenario
    uses the fused kernel and the reverse) is added at the same shapes, so one profile
    answers either setting of ``training.attention``.
    """
    variants = [scenario]
    if both_attention_paths:
        other = "unfused" if scenario.training.attention == "flash" else "flash"
        variants.append(scenario.model_copy(update={"training": scenario.training.model_copy(
            update={"attention": other})}))
    seen: dict[tuple, dict] = {}
    for variant in variants:
        layout = resolve(variant)
        context = op_context(variant, layout)
        workload = build_workload(variant, layout)
        for stage in workload.stages:
            for work in (stage.forward, stage.backward, stage.backward_input, stage.backward_weight):
                for block in work:
                    for op in compute_ops(block.items):
                        seen.setdefault(op_key(op), op_record(op, context))
    return list(seen.values())


def sweep_ops(dtype: str) -> list[dict]:
    """Square forward GEMMs of :data:`SWEEP_SIZES` for the efficiency curve."""
    element = 4 if dtype in ("fp32", "tf32") else 2
    ops = []
    for n in SWEEP_SIZES:
        ops.append({"kind": "gemm", "name": f"sweep.{n}", "shape": [1, n, n, n], "layout": "forward",
                    "flops": 2.0 * n**3, "bytes": 3.0 * n * n * element, "direction": "", "context": None})
    return ops
