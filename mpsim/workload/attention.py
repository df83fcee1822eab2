"""The attention block on one rank: norm, projections, attention core, output projection.

Projections are either MHA/GQA's fused QKV GEMM (column-parallel over heads) or
multi-head latent attention's low-rank path (DeepSeek-V2/V3): a replicated down
projection to the compressed query and key/value ranks, then column-parallel up
projections per head. The core is either a fused FlashAttention-style kernel (scores
never reach HBM, causal blocks above the diagonal skipped, scores recomputed in the
backward) or Megatron's unfused path (baddbmm, softmax, dropout, bmm through HBM).

With context parallelism each rank holds 1/cp of the sequence; its queries still attend
over the whole sequence, which the keys and values reach by a ring, an all-gather or
all-to-alls (``mpsim/workload/context_parallel.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.workload.blocks import (BlockWork, LayerContext, bias_add, bias_dropout_add, bias_dropout_add_grad,
                                   bias_grad, column_backward, gathered_gemm, grad_gather, linear, param_tensors,
                                   present, scattered_gemm, tp_collectives, weight_pass_regather)
from mpsim.workload.norms import norm, norm_grad, norm_saved_bytes
from mpsim.workload.context_parallel import context_parallel
from mpsim.workload.ops import Item, Op, Overlap, collective, gemm, memory_op
from mpsim.workload.op_recompute import attention_op_recompute

# A fused kernel under a causal mask computes the s (s + 1) / 2 query-key pairs of the lower
# triangle, diagonal included, and its published rates count exactly those (cuDNN's benchmark
# sums the mask; FlashAttention's halve the full count). Its whole key blocks on the diagonal,
# partly masked, cost time that is already in those rates, so the FLOPs here are the
# triangle's, not the blocks': counting the blocks too would charge that time twice.


def flash_backward_flops(forward_flops: float, d_qk: int, d_v: int) -> float:
    """FLOPs of FlashAttention's backward given its forward's.

    The forward runs two matmuls per query-key pair, S = QK^T (over the query/key head
    size) and PV (over the value head size); the backward five: S again, dV = P^T dO and
    dP = dO V^T (value size), dQ = dS K and dK = dS^T Q (query/key size) (Dao 2023,
    Sec. 3.1.2). So it does (3 d_qk + 2 d_v) / (d_qk + d_v) of the forward, 2.5 where the two
    sizes are equal; MLA's 192 and 128 make it 2.6, as cuDNN's own benchmark counts it
    (CUDNN-SDPA-GB200-MLA).
    """
    return forward_flops * (3 * d_qk + 2 * d_v) / (d_qk + d_v)


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention dimensions."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


# Kernels plain PyTorch launches around a fused attention call, as the project's H200 profiler
# trace shows them per layer and microbatch (benchmarks/data/h200_gpipe_trace_rank0.json.gz,
# PyTorch's scaled_dot_product_attention on its cuDNN backend): the forward call launches a
# memset and the attention kernel, the backward a memset and three kernels; and autograd's
# backward of the packed QKV activation's split into heads (``unbind`` of a permuted view)
# stacks the three gradients (``aten::cat``) and copies them back to the packed layout
# (``aten::copy_``). Their time is in the op's (a calibrated ``attn.flash`` is measured on
# that very code); each launch is one more interval of the host's pace (cost/actions.py).
SDPA_FORWARD_LAUNCHES = 2
SDPA_BACKWARD_LAUNCHES = 4
PACKED_QKV_BACKWARD_LAUNCHES = 2

# Rotary embeddings as one fused kernel (Megatron's and Transformer Engine's apply_rotary_pos_emb
# kernels): read the query or key, write it rotated, in both passes. Plain PyTorch writes it as
# ``t * cos + rotate_half(t) * sin`` with ``rotate_half(t) = cat(-t2, t1)`` (the Hugging Face
# and Llama reference form), one kernel per operator under autograd; per element of the query
# and key, in activation-sized reads and writes:
#   forward: neg of one half (0.5 + 0.5), cat (1 + 1), t * cos (1 + 1), rotated * sin (1 + 1),
#   the sum (2 + 1): 10 in 5 kernels;
#   backward: grad * cos (1 + 1), grad * sin (1 + 1), neg of one half (0.5 + 0.5), each of the
#   two slices' backward a zero-filled tensor (1) with the half copied in (0.5 + 0.5), and the
#   three gradients of t summed in place twice (2 + 1 each): 15 in 9 kernels.
# cos and sin, one row per position shared by every head, are read from cache and not counted.
ROPE_FUSED = (2, 2, 1, 1)  # (forward traffic, backward traffic, launches forward, launches backward)
ROPE_PLAIN = (10, 15, 2 * 5, 2 * 9)  # the query and the key each through the kernels above


def _kernel_calls(ctx: LayerContext) -> tuple[int, float, int]:
    """(keys per query in one fused kernel call, share of the FLOPs under a causal mask,
    keys per query of the unmasked calls on the rank that sees the fewest; 0: the first).

    Without context parallelism, or with an all-gather of K/V (Llama 3) or Ulysses'
    all-to-all, one call covers the whole sequence under the model's mask. A ring
    (Megatron / Transformer Engine) makes ``cp`` calls over blocks of ``s / cp`` keys: the
    first on the rank's own, load-balanced chunks under the causal mask, the others on a
    block that is wholly visible, each with the same FLOPs, so ``1 / cp`` of the work is
    masked. A visible block is half the arriving keys for all its queries on a step from a
    rank before this one, half the queries against all the keys on a step from one after
    it (``AttnFuncWithCPAndKVP2P``, Transformer Engine 1.11): the last rank makes all its
    unmasked calls over ``s / 2cp`` keys, the first over ``s / cp``, and the ranks meet at
    every step's transfer, so the pass goes at whichever of the two is slower.
    """
    s = ctx.seq_length
    if not ctx.causal:
        return s, 0.0, 0
    if ctx.cp > 1 and ctx.cp_comm == "ring":
        return max(1, s // ctx.cp), 1.0 / ctx.cp, max(1, s // (2 * ctx.cp))
    return s, 1.0, 0


def _core(ctx: LayerContext) -> tuple[list[Item], list[Item], float]:
    """(forward items, backward items, saved bytes) of softmax(QK^T)V on one rank."""
    b, s, e = ctx.microbatch_size, ctx.seq_length, ctx.act_bytes
    d_qk, d_v = ctx.head_dim, ctx.value_dim
    heads, kv = ctx.heads_local, ctx.kv_local
    queries = ctx.tokens  # b * s / cp
    if ctx.cp_comm == "all-to-all" and ctx.cp > 1:
        heads, kv, queries = max(1, heads // ctx.cp), max(1, kv // ctx.cp), ctx.tokens * ctx.cp
    if ctx.flash_attention:
        causal_fraction = (1 + 1 / s) / 2 if ctx.causal else 1.0
        fwd_flops = 2.0 * queries * s * heads * (d_qk + d_v) * causal_fraction
        qkv_bytes = queries * (heads * d_qk + kv * (d_qk + d_v)) * e
        out_bytes = queries * heads * d_v * e
        lse_bytes = b * heads * (queries // b) * 4
        kernel_seq, causal_share, unmasked_seq = _kernel_calls(ctx)
        plain = ctx.layers_impl == "pytorch"
        fwd = Op("attn.flash", "attention", flops=fwd_flops, bytes=qkv_bytes + out_bytes + lse_bytes,
                 direction="forward", dtype=ctx.attention_dtype, kernel_seq=kernel_seq, causal_share=causal_share,
                 unmasked_seq=unmasked_seq, head_dim=d_qk,
                 launches=SDPA_FORWARD_LAUNCHES if plain else 1)
        bwd = Op("attn.flash.grad", "attention", flops=flash_backward_flops(fwd_flops, d_qk, d_v),
                 bytes=2 * qkv_bytes + 2 * out_bytes + lse_bytes, direction="backward", dtype=ctx.attention_dtype,
                 kernel_seq=kernel_seq, causal_share=causal_share, unmasked_seq=unmasked_seq, head_dim=d_qk,
                 launches=SDPA_BACKWARD_LAUNCHES + PACKED_QKV_BACKWARD_LAUNCHES if plain else 1)
        return [fwd], [bwd], float(lse_bytes)
    # Megatron's unfused path: the full s x s scores are computed, written, then masked
    batch = b * heads
    scores = batch * s * s
    mask = 1 if ctx.dropout else 0
    fwd: list[Item] = [gemm("attn.scores", s, s, d_qk, batch=batch, in_bytes=e, out_bytes=e, dtype=ctx.attention_dtype),
                       memory_op("attn.softmax", scores * 2 * e)]
    if ctx.dropout:
        fwd.append(memory_op("attn.dropout", scores * (2 * e + mask)))
    fwd.append(gemm("attn.context", s, d_v, s, batch=batch, in_bytes=e, out_bytes=e, dtype=ctx.attention_dtype))
    # the context comes out head by head ([b, heads, s, d]) and is copied back to the token-major
    # layout the output projection reads: Megatron's permute(2, 0, 1, 3).contiguous()
    # (CoreAttention in megatron/model/transformer.py, DotProductAttention in Megatron-Core),
    # Hugging Face's eager attention's transpose(1, 2).contiguous(); read and write
    fwd.append(memory_op("attn.context.to_tokens", queries * heads * d_v * 2 * e))
    bwd: list[Item] = [gemm("attn.context.grad_probs", s, s, d_v, batch=batch, in_bytes=e, out_bytes=e, dtype=ctx.attention_dtype),
                       gemm("attn.context.grad_v", s, d_v, s, batch=batch, in_bytes=e, out_bytes=e, dtype=ctx.attention_dtype)]
    if ctx.dropout:
        bwd.append(memory_op("attn.dropout.grad", scores * (2 * e + mask)))
    bwd += [memory_op("attn.softmax.grad", scores * 3 * e),
            gemm("attn.scores.grad_q", s, d_qk, s, batch=batch, in_bytes=e, out_bytes=e, dtype=ctx.attention_dtype),
            gemm("attn.scores.grad_k", s, d_qk, s, batch=batch, in_bytes=e, out_bytes=e, dtype=ctx.attention_dtype)]
    saved = scores * (e + (mask + e if ctx.dropout else 0))  # probs (+ dropout mask and output)
    return fwd, bwd, float(saved)


def qkv_split(ctx: LayerContext) -> tuple[list[Op], list[Op]]:
    """(forward, backward) copies around the packed QKV output in Megatron-Core with Transformer Engine.

    Megatron-Core splits the QKV GEMM's output into views per query group
    (``SelfAttention.get_query_key_value_tensors``, core_r0.9.0): with grouped queries the
    query's reshape to one head per row cannot be a view, so it copies the queries (read and
    write). Transformer Engine's attention then finds V strided differently from the rotated
    K and copies all three to contiguous tensors (``get_qkv_layout``, TE 1.11: the layout is
    "not_supported" until they are), which copies V; Q and K, written fresh by the rotary
    kernel, are already contiguous. In the backward the split's gradient is the three
    gradients concatenated into one (``_SplitAlongDim.backward``: they are separate
    tensors, so ``torch.cat``). Other implementations keep their own layouts.
    """
    if ctx.layers_impl != "transformer_engine":
        return [], []
    t, e, heads, kv = ctx.tokens, ctx.act_bytes, ctx.heads_local, ctx.kv_local
    q, k, v = t * heads * ctx.head_dim * e, t * kv * ctx.head_dim * e, t * kv * ctx.value_dim * e
    grouped = ctx.heads != ctx.kv_heads
    forward = memory_op("attn.qkv_split", 2 * v + (2 * q if grouped else 0), launches=2 if grouped else 1)
    return [forward], [memory_op("attn.qkv_split.grad", 2 * (q + k + v))]


def self_attention(ctx: LayerContext, mla: MLAShape | None, bias: bool) -> BlockWork:
    """Projections, core and output projection on one rank, without the norm before or the residual after.

    This is the attention layer of a layer stack (``mpsim/workload/layers.py``); the
    transformer's :func:`attention_block` wraps it in its norm and bias-dropout-add.
    """
    t, h, e = ctx.tokens, ctx.hidden, ctx.act_bytes
    heads, d_qk, d_v = ctx.heads_local, ctx.head_dim, ctx.value_dim
    # MLA's gather is Megatron's own (gather_from_sequence_parallel_region) of a bf16 tensor,
    # not a Transformer Engine linear's fp8 operand
    gather, reduce = tp_collectives(ctx, "attn", gathers_operand=mla is None)
    core_fwd, core_bwd, core_saved = _core(ctx)
    core_fwd, core_bwd = context_parallel(ctx, core_fwd, core_bwd)
    # the attention core hands the projection a bf16 output (Transformer Engine's
    # DotProductAttention), which an fp8 run casts in the projection itself
    proj, proj_dgrad, proj_wgrad = linear(ctx, "attn.proj", t, h, heads * d_v, input_cast=not ctx.fp8_attention,
                                          gathered_grad=True)

    if mla is None:
        width = (heads + 2 * ctx.kv_local) * d_qk if d_v == d_qk else heads * d_qk + ctx.kv_local * (d_qk + d_v)
        qkv, qkv_dgrad, qkv_wgrad = linear(ctx, "attn.qkv", t, width, h, gathered_input=True)
        projections = gathered_gemm(ctx, gather, qkv) + (bias_add(ctx, "attn.qkv", t, width) if bias else [])
        proj_b, proj_i, proj_w = column_backward(ctx, "attn.qkv", qkv_dgrad, qkv_wgrad, gather)
        if bias:
            qkv_bias_grad = bias_grad(ctx, "attn.qkv", t, width)
            proj_b, proj_i = qkv_bias_grad + proj_b, qkv_bias_grad + proj_i
        params = h * width + (width if bias else 0)
        tensors = [h * width, *([width] if bias else [])]
        saved_proj = t * width * e
        # the QKV GEMM's input as it arrives (1/tp of the tokens under sequence parallelism,
        # gathered again for the weight pass) and its output gradient
        wbuf = (ctx.norm_tokens * h + t * width) * e
    else:
        q_in = mla.q_lora_rank or h
        down_width = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim
        down, down_dgrad, down_wgrad = linear(ctx, "attn.down", t, down_width, h)
        q_up, q_dgrad, q_wgrad = linear(ctx, "attn.q_up", t, heads * d_qk, q_in)
        kv_up, kv_dgrad, kv_wgrad = linear(ctx, "attn.kv_up", t, heads * (mla.qk_nope_head_dim + d_v),
                                           mla.kv_lora_rank)
        latent_norms = memory_op("attn.latent_norms", t * down_width * e * 2)
        # the all-gather feeds the replicated down projection; userbuffers' ring exchange
        # is wired to the column-parallel QKV GEMM, so nothing overlaps it here
        projections = [*present(gather), down, latent_norms, q_up, kv_up]
        # the up projections are column-parallel over heads: the latent gradients are
        # partial sums over TP (small); the down projection is replicated, so the input
        # gradient is then complete on every rank
        latent_reduce = (collective("attn.latent_grad_all_reduce", "all-reduce", "tp", t * down_width * e)
                         if ctx.tp > 1 else None)
        regather = (collective("attn.regather_input", "all-gather", "tp", ctx.activation_message)
                    if gather is not None else None)
        up_grads = [q_dgrad, kv_dgrad]
        latent = memory_op("attn.latent_norms.grad", t * down_width * e * 3)
        proj_b = [*up_grads, q_wgrad, kv_wgrad, *present(latent_reduce), latent,
                  Overlap(regather, (down_dgrad,)) if regather else down_dgrad, down_wgrad]
        proj_i = [*up_grads, *present(latent_reduce), latent, *present(regather), down_dgrad]
        proj_w = [q_wgrad, kv_wgrad, down_wgrad]
        params = h * down_width + 2 * down_width + q_in * heads * d_qk + mla.kv_lora_rank * heads * (
            mla.qk_nope_head_dim + d_v)
        # the down projection, the latent norms' weights, the two up projections
        tensors = [h * down_width, 2 * down_width, q_in * heads * d_qk,
                   mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + d_v)]
        saved_proj = t * (down_width + 2 * heads * d_qk + heads * d_v) * e
        wbuf = t * (h + down_width + q_in + mla.kv_lora_rank + heads * d_qk + heads * (mla.qk_nope_head_dim + d_v)) * e
    forward_traffic, backward_traffic, forward_launches, backward_launches = \
        ROPE_PLAIN if ctx.layers_impl == "pytorch" else ROPE_FUSED
    rotated = t * (heads + ctx.kv_local) * d_qk * e
    rope = [memory_op("attn.rope", forward_traffic * rotated, launches=forward_launches)] if ctx.rope else []
    rope_grad = [memory_op("attn.rope.grad", backward_traffic * rotated, launches=backward_launches)] \
        if ctx.rope else []

    split, split_grad = qkv_split(ctx) if mla is None else ([], [])
    forward: list[Item] = [*projections, *split, *rope, *core_fwd, *scattered_gemm(ctx, proj, reduce)]
    # the output projection's bias is added after its reduction, on the sequence-parallel tokens
    head = ((bias_grad(ctx, "attn.proj", ctx.norm_tokens, h) if bias else [])
            + gathered_gemm(ctx, grad_gather(ctx, "attn.proj"), proj_dgrad))
    backward = [*head, proj_wgrad, *core_bwd, *rope_grad, *split_grad, *proj_b]
    backward_input = [*head, *core_bwd, *rope_grad, *split_grad, *proj_i]
    backward_weight = [*present(weight_pass_regather(ctx, "attn.proj")), proj_wgrad, *proj_w]

    params += heads * d_v * h + (h if bias else 0)
    tensors += [heads * d_v * h, *([h] if bias else [])]
    context = t * heads * d_v * e
    # the projections' input (1/tp of the tokens under sequence parallelism, re-gathered
    # for the backward), their output, what the core keeps, the output projection's input
    saved = ctx.norm_tokens * h * e + saved_proj + core_saved + context
    # output projection: its input and its output gradient as it arrives (gathered again for the weight pass)
    wbuf += (t * heads * d_v + ctx.norm_tokens * h) * e
    op_redo, op_saved = (None, 0.0) if mla is not None else attention_op_recompute(
        ctx, gather, reduce, rope, core_fwd, core_saved, context, proj)
    # Megatron-Core's mla_up_proj recompute: the up projections and the rotary embedding run again,
    # their outputs (the core's queries, keys and values) discarded once the core has run
    parts = (("mla_up_proj", (q_up, kv_up, *rope), float(t * (2 * heads * d_qk + heads * d_v) * e)),) \
        if mla is not None else ()
    return BlockWork(tuple(forward), tuple(backward), tuple(backward_input), tuple(backward_weight),
                     recompute_selective=tuple(core_fwd), params=float(params), saved_bytes=float(saved),
                     selective_saved_bytes=float(core_saved), weight_grad_buffer_bytes=float(wbuf),
                     param_tensors=param_tensors(*tensors), recompute_op=op_redo, op_saved_bytes=op_saved,
                     recompute_parts=parts)


def attention_block(ctx: LayerContext, mla: MLAShape | None, bias: bool, norm_params: int) -> BlockWork:
    """The attention half of a layer on one rank: norm, self-attention, bias-dropout-add."""
    inner = self_attention(ctx, mla, bias)
    h, local, e, mask = ctx.hidden, ctx.norm_tokens, ctx.act_bytes, 1 if ctx.dropout else 0
    before, after = norm(ctx, "attn.norm"), bias_dropout_add(ctx, "attn.bda")
    (norm_in, norm_w), after_grad = norm_grad(ctx, "attn.norm"), bias_dropout_add_grad(ctx, "attn.bda")
    # the norm's input and the residual's dropout mask, beside what self-attention keeps
    saved = inner.saved_bytes + local * h * e + local * h * mask + norm_saved_bytes(ctx)
    # op-level recompute: the checkpoint keeps the layer's input and runs the norm and the
    # residual add again (the next norm reads the sum)
    op_redo = None if inner.recompute_op is None else (before, *inner.recompute_op, after)
    # Megatron-Core's layernorm recompute: a norm that is a module of its own (Megatron's local
    # layers; MLA's, which feeds two down projections) drops the output its consumer keeps;
    # Transformer Engine's fused LayerNormLinear has none to drop (gpt_layer_specs.py)
    separate_norm = ctx.layers_impl == "local" or mla is not None
    parts = inner.recompute_parts + ((("layernorm", (before,), float(local * h * e)),) if separate_norm else ())
    return BlockWork((before, *inner.forward, after), (*after_grad, *inner.backward, *norm_in, *norm_w),
                     (*after_grad, *inner.backward_input, *norm_in), (*inner.backward_weight, *norm_w),
                     recompute_selective=inner.recompute_selective, params=inner.params + norm_params * h,
                     saved_bytes=saved, selective_saved_bytes=inner.selective_saved_bytes,
                     weight_grad_buffer_bytes=inner.weight_grad_buffer_bytes,
                     param_tensors=inner.param_tensors + (float(h),) * norm_params,
                     recompute_op=op_redo, op_saved_bytes=inner.op_saved_bytes + local * h * e,
                     recompute_parts=parts)
