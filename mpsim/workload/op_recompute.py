"""Op-level selective recompute: what a layer keeps and what its backward runs again.

PyTorch's selective activation checkpointing (``torch.utils.checkpoint`` with a policy from
``create_selective_checkpoint_contexts``) decides per operator whether the forward keeps
its output or the backward recomputes it. torchtitan's ``selective_ac_option = "op"``
(``parallelize_llama.py`` at the commit of its April 2024 performance page, 157a12c, and
``activation_checkpoint.py`` since) wraps each transformer block in a checkpoint whose
policy keeps the outputs of the fused attention kernels
(``aten._scaled_dot_product_flash_attention`` / ``_efficient_attention``), of the
``_c10d_functional.reduce_scatter_tensor`` collective, and of every odd-numbered
``aten.mm`` of the block (a counter per block); everything else is recomputed.

A Llama block runs its matmuls in the order query, key, value, output projection, FFN
gate, FFN up projection, FFN down projection (torchtitan's ``Attention`` and
``FeedForward``; Hugging Face's Llama the same), so the forward keeps the query, the
value, the gate and the down projection's outputs, with the block's input, which the
checkpoint keeps. The backward first runs the block forward again up to the last tensor it
needs (non-reentrant checkpointing stops early): the attention norm, the key projection,
the rotary embedding, the output projection and the residual add (the FFN norm reads the
sum), the FFN norm, the up projection and the activation. A plain FFN has no up
projection: its second matmul is the down projection, whose output nothing in the backward
reads, so it is not run again. Under tensor parallelism the all-gathers of the
sequence-parallel input run again; a reduce-scatter's output is kept. The unfused
attention's batched matmuls (``aten.bmm``) and softmax are not on the list and run again.

Linear layers with a bias run as ``aten.addmm``, which the policy neither counts nor keeps:
such a layer would recompute all its projections, a different policy, so
``parallel.recompute: selective-op`` is refused for them (``specs/layout_checks.py``), as
for MoE and MLA layers, whose matmuls follow other patterns.
"""

from __future__ import annotations

from mpsim.workload.blocks import LayerContext, gathered_gemm, linear, scattered_gemm
from mpsim.workload.ops import Item, Op


def attention_op_recompute(ctx: LayerContext, gather: Op | None, reduce: Op | None, rope: list[Item],
                           core_forward: list[Item], core_saved: float, context_bytes: float,
                           projection: Op) -> tuple[tuple[Item, ...], float]:
    """(items run again, bytes kept) of self-attention under op-level selective recompute,
    without the norm and residual add around it (``attention_block`` adds them)."""
    t, h, e = ctx.tokens, ctx.hidden, ctx.act_bytes
    heads, kv, d_qk, d_v = ctx.heads_local, ctx.kv_local, ctx.head_dim, ctx.value_dim
    # the second matmul: the key projection, on the norm's output gathered again
    key = linear(ctx, "attn.key", t, kv * d_qk, h, gathered_input=True)[0]
    items: list[Item] = [*gathered_gemm(ctx, gather, key), *rope]
    saved = float(t * heads * d_qk * e + t * kv * d_v * e)  # the query's and the value's outputs
    if ctx.flash_attention:
        saved += core_saved + context_bytes  # the fused kernel's output and softmax statistics
    else:
        items += core_forward
    # the fourth matmul, the output projection: the FFN norm reads the residual sum
    if reduce is not None and reduce.collective == "reduce-scatter":
        items.append(projection)
        saved += ctx.norm_tokens * h * e  # the reduce-scatter's output is kept
    else:
        items += scattered_gemm(ctx, projection, reduce)
    return tuple(items), saved


def mlp_op_recompute(ctx: LayerContext, gather: Op | None, reduce: Op | None, fc1s: tuple[Op, ...], act: Op,
                     fc1_width: int) -> tuple[tuple[Item, ...], float]:
    """(items run again, bytes kept) of a dense FFN under op-level selective recompute, its
    matmuls numbered on from the attention's four; without its norm (``mlp_block`` adds it)."""
    t, h, e = ctx.tokens, ctx.hidden, ctx.act_bytes
    kept_rs = ctx.norm_tokens * h * e if reduce is not None and reduce.collective == "reduce-scatter" else 0.0
    if len(fc1s) == 2:  # gate (fifth, kept), up (sixth, run again), down (seventh, kept)
        gate, up = fc1s
        return ((*gathered_gemm(ctx, gather, up), act),
                float(t * gate.shape[2] * e + t * h * e + kept_rs))
    # one up projection (fifth, kept); the down projection (sixth) is not needed again
    return ((*([gather] if gather is not None else []), act), float(t * fc1_width * e + kept_rs))
