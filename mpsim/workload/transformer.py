"""One transformer layer under Megatron tensor parallelism, as ops per rank.

The layer is the usual pre-norm block: norm -> QKV -> attention core -> output
projection -> bias-dropout-add, then norm -> FC1 -> activation -> FC2 ->
bias-dropout-add. Tensor parallelism splits QKV and FC1 by columns and the output
projection and FC2 by rows (Shoeybi et al. 2019), which puts one all-reduce after each
row-parallel GEMM in the forward pass and one after each column-parallel GEMM's input
gradient in the backward pass. With sequence parallelism (Korthikanti et al. 2022) each
all-reduce becomes a reduce-scatter plus an all-gather and the norms and dropouts run on
1/tp of the tokens.

The backward pass is kept in three forms: combined (``B``), and split into the input
gradient (``I``) and the weight gradient (``W``) that zero-bubble schedules move apart.
In the combined form Megatron overlaps the column-parallel input-gradient collective with
the weight-gradient GEMM; in the split form that collective is exposed in ``I``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.workload.ops import Item, Op, Overlap, collective, gemm, memory_op

# FlashAttention works on key blocks of this many tokens; with a causal mask it skips the
# blocks above the diagonal, so it runs (1 + 1/blocks) / 2 of the full score FLOPs.
FLASH_BLOCK_TOKENS = 128
# FlashAttention-2's backward does 5 matmuls of the forward's 2 (Dao 2023, Sec. 3.1.2).
FLASH_BACKWARD_FLOPS_RATIO = 2.5


@dataclass(frozen=True)
class LayerContext:
    """Shapes of one layer on one tensor-parallel rank, and the framework options."""

    microbatch_size: int
    seq_length: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    gated_ffn: bool
    tp: int
    sequence_parallel: bool
    flash_attention: bool
    dropout: bool
    rope: bool
    act_bytes: int = 2  # activations (bf16)
    gemm_in_bytes: int = 2  # GEMM operands (1 for fp8)
    wgrad_accumulate_bytes: int = 4  # weight gradients accumulated in fp32 (Megatron main_grad)
    tp_overlap_backward: bool = True

    @property
    def tokens(self) -> int:
        return self.microbatch_size * self.seq_length

    @property
    def norm_tokens(self) -> int:
        """Tokens a norm / dropout sees: 1/tp of them under sequence parallelism."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @property
    def heads_local(self) -> int:
        return self.heads // self.tp

    @property
    def kv_local(self) -> int:
        return self.kv_heads // self.tp

    @property
    def qkv_local(self) -> int:
        """Output columns of the QKV projection on one rank."""
        return (self.heads_local + 2 * self.kv_local) * self.head_dim

    @property
    def ffn_local(self) -> int:
        return self.ffn_hidden // self.tp

    @property
    def fc1_local(self) -> int:
        """Output columns of FC1 on one rank (gate and value for SwiGLU)."""
        return self.ffn_local * (2 if self.gated_ffn else 1)

    @property
    def activation_message(self) -> float:
        """Bytes of a full [tokens, hidden] activation: the TP collective payload."""
        return float(self.tokens * self.hidden * self.act_bytes)


@dataclass(frozen=True)
class LayerPasses:
    """What one rank runs for one layer and one microbatch."""

    forward: tuple[Item, ...]
    recompute_selective: tuple[Item, ...]  # the attention core, re-run before backward
    backward: tuple[Item, ...]  # combined input + weight gradient
    backward_input: tuple[Item, ...]
    backward_weight: tuple[Item, ...]


def _tp_ops(ctx: LayerContext, name: str) -> tuple[Op | None, Op | None]:
    """Collectives around a TP block: (before column-parallel GEMM, after row-parallel GEMM)."""
    if ctx.tp == 1:
        return None, None
    message = ctx.activation_message
    if ctx.sequence_parallel:
        return (collective(f"{name}.all_gather", "all-gather", "tp", message),
                collective(f"{name}.reduce_scatter", "reduce-scatter", "tp", message))
    return None, collective(f"{name}.all_reduce", "all-reduce", "tp", message)


def _norm(ctx: LayerContext, name: str, backward: bool = False) -> Op:
    elems = ctx.norm_tokens * ctx.hidden
    return memory_op(f"{name}{'.grad' if backward else ''}", elems * ctx.act_bytes * (3 if backward else 2))


def _bias_dropout_add(ctx: LayerContext, name: str, backward: bool = False) -> Op:
    elems = ctx.norm_tokens * ctx.hidden
    mask = 1 if ctx.dropout else 0
    return memory_op(f"{name}{'.grad' if backward else ''}", elems * (3 * ctx.act_bytes + mask))


def _linear(ctx: LayerContext, name: str, m: int, n: int, k: int) -> tuple[Op, Op, Op]:
    """(forward, input-gradient, weight-gradient) GEMMs of Y[m,n] = X[m,k] W[k,n]."""
    e = ctx.gemm_in_bytes
    fwd = gemm(name, m, n, k, in_bytes=e, out_bytes=ctx.act_bytes)
    dgrad = gemm(f"{name}.dgrad", m, k, n, in_bytes=e, out_bytes=ctx.act_bytes)
    wgrad = gemm(f"{name}.wgrad", k, n, m, in_bytes=e, out_bytes=0, accumulate_bytes=ctx.wgrad_accumulate_bytes)
    return fwd, dgrad, wgrad


def _attention_core(ctx: LayerContext) -> tuple[list[Op], list[Op]]:
    """(forward ops, backward ops) of softmax(QK^T)V on one rank."""
    b, s, d, e = ctx.microbatch_size, ctx.seq_length, ctx.head_dim, ctx.act_bytes
    heads, kv = ctx.heads_local, ctx.kv_local
    tokens = ctx.tokens
    if ctx.flash_attention:
        blocks = max(1, -(-s // FLASH_BLOCK_TOKENS))
        causal_fraction = (1 + 1 / blocks) / 2
        fwd_flops = 4.0 * b * heads * s * s * d * causal_fraction
        qkv_bytes = tokens * (heads + 2 * kv) * d * e
        out_bytes = tokens * heads * d * e
        lse_bytes = b * heads * s * 4
        fwd = Op("attn.flash", "attention", flops=fwd_flops, bytes=qkv_bytes + out_bytes + lse_bytes,
                 direction="forward")
        bwd = Op("attn.flash.grad", "attention", flops=fwd_flops * FLASH_BACKWARD_FLOPS_RATIO,
                 bytes=2 * qkv_bytes + 2 * out_bytes + lse_bytes, direction="backward")
        return [fwd], [bwd]
    # Megatron's unfused path: baddbmm for the scores, fused scale-mask-softmax, dropout,
    # bmm with V. The full s x s scores are computed and written; the mask is applied after.
    batch = b * heads
    scores = batch * s * s
    mask = 1 if ctx.dropout else 0
    fwd = [gemm("attn.scores", s, s, d, batch=batch, in_bytes=e, out_bytes=e),
           memory_op("attn.softmax", scores * 2 * e)]
    if ctx.dropout:
        fwd.append(memory_op("attn.dropout", scores * (2 * e + mask)))
    fwd.append(gemm("attn.context", s, d, s, batch=batch, in_bytes=e, out_bytes=e))
    bwd = [gemm("attn.context.grad_probs", s, s, d, batch=batch, in_bytes=e, out_bytes=e),
           gemm("attn.context.grad_v", s, d, s, batch=batch, in_bytes=e, out_bytes=e)]
    if ctx.dropout:
        bwd.append(memory_op("attn.dropout.grad", scores * (2 * e + mask)))
    bwd += [memory_op("attn.softmax.grad", scores * 3 * e),
            gemm("attn.scores.grad_q", s, d, s, batch=batch, in_bytes=e, out_bytes=e),
            gemm("attn.scores.grad_k", s, d, s, batch=batch, in_bytes=e, out_bytes=e)]
    return fwd, bwd


def _column_backward(ctx: LayerContext, name: str, dgrad: Op, wgrad: Op,
                     gather: Op | None) -> tuple[list[Item], list[Item], list[Item]]:
    """Backward of a column-parallel GEMM: (combined, input-only, weight-only) items.

    Its input gradient needs an all-reduce over TP (a reduce-scatter under sequence
    parallelism, which also re-gathers the sharded input for the weight gradient).
    """
    if ctx.tp == 1:
        return [dgrad, wgrad], [dgrad], [wgrad]
    kind = "reduce-scatter" if ctx.sequence_parallel else "all-reduce"
    reduce = collective(f"{name}.grad_{kind.replace('-', '_')}", kind, "tp", ctx.activation_message)
    regather = (collective(f"{name}.regather_input", "all-gather", "tp", ctx.activation_message)
                if gather is not None else None)
    if ctx.tp_overlap_backward:
        combined: list[Item] = [Overlap(regather, (dgrad,)) if regather else dgrad, Overlap(reduce, (wgrad,))]
    else:
        combined = ([regather] if regather else []) + [dgrad, reduce, wgrad]
    input_only: list[Item] = [dgrad, reduce]
    weight_only: list[Item] = ([regather] if regather else []) + [wgrad]
    return combined, input_only, weight_only


def layer_passes(ctx: LayerContext) -> LayerPasses:
    """Decompose one transformer layer on one TP rank into forward and backward passes."""
    t, h, d = ctx.tokens, ctx.hidden, ctx.head_dim
    e = ctx.act_bytes
    attn_gather, attn_reduce = _tp_ops(ctx, "attn")
    mlp_gather, mlp_reduce = _tp_ops(ctx, "mlp")
    qkv, qkv_dgrad, qkv_wgrad = _linear(ctx, "attn.qkv", t, ctx.qkv_local, h)
    proj, proj_dgrad, proj_wgrad = _linear(ctx, "attn.proj", t, h, ctx.heads_local * d)
    fc1, fc1_dgrad, fc1_wgrad = _linear(ctx, "mlp.fc1", t, ctx.fc1_local, h)
    fc2, fc2_dgrad, fc2_wgrad = _linear(ctx, "mlp.fc2", t, h, ctx.ffn_local)
    core_fwd, core_bwd = _attention_core(ctx)
    rope_bytes = 2 * t * (ctx.heads_local + ctx.kv_local) * d * e
    act_elems = t * ctx.ffn_local
    act_fwd = memory_op("mlp.act", act_elems * e * (3 if ctx.gated_ffn else 2))
    act_bwd = memory_op("mlp.act.grad", act_elems * e * (5 if ctx.gated_ffn else 3))

    def present(*ops: Op | None) -> list[Item]:
        return [op for op in ops if op is not None]

    forward: list[Item] = [_norm(ctx, "attn.norm"), *present(attn_gather), qkv]
    if ctx.rope:
        forward.append(memory_op("attn.rope", rope_bytes))
    forward += core_fwd
    forward += [proj, *present(attn_reduce), _bias_dropout_add(ctx, "attn.bda"),
                _norm(ctx, "mlp.norm"), *present(mlp_gather), fc1, act_fwd, fc2, *present(mlp_reduce),
                _bias_dropout_add(ctx, "mlp.bda")]

    # Backward of the row-parallel GEMMs' reduce-scatter is an all-gather of the gradient.
    def grad_gather(name: str) -> list[Item]:
        if ctx.tp > 1 and ctx.sequence_parallel:
            return [collective(f"{name}.grad_all_gather", "all-gather", "tp", ctx.activation_message)]
        return []

    fc1_b, fc1_i, fc1_w = _column_backward(ctx, "mlp.fc1", fc1_dgrad, fc1_wgrad, mlp_gather)
    qkv_b, qkv_i, qkv_w = _column_backward(ctx, "attn.qkv", qkv_dgrad, qkv_wgrad, attn_gather)
    rope_bwd = [memory_op("attn.rope.grad", rope_bytes)] if ctx.rope else []

    mlp_head = [_bias_dropout_add(ctx, "mlp.bda", backward=True), *grad_gather("mlp.fc2"), fc2_dgrad]
    attn_head = [_bias_dropout_add(ctx, "attn.bda", backward=True), *grad_gather("attn.proj"), proj_dgrad]
    backward = [*mlp_head, fc2_wgrad, act_bwd, *fc1_b, _norm(ctx, "mlp.norm", backward=True),
                *attn_head, proj_wgrad, *core_bwd, *rope_bwd, *qkv_b, _norm(ctx, "attn.norm", backward=True)]
    backward_input = [*mlp_head, act_bwd, *fc1_i, _norm(ctx, "mlp.norm", backward=True),
                      *attn_head, *core_bwd, *rope_bwd, *qkv_i, _norm(ctx, "attn.norm", backward=True)]
    backward_weight = [fc2_wgrad, *fc1_w, proj_wgrad, *qkv_w]
    return LayerPasses(tuple(forward), tuple(core_fwd), tuple(backward), tuple(backward_input),
                       tuple(backward_weight))


def layer_params(ctx: LayerContext, norm_params_per_hidden: int, bias: bool) -> float:
    """Parameters of one layer held by one TP rank (norms and row-parallel biases replicated)."""
    h, d = ctx.hidden, ctx.head_dim
    weights = h * ctx.qkv_local + ctx.heads_local * d * h + h * ctx.fc1_local + ctx.ffn_local * h
    biases = (ctx.qkv_local + h + ctx.fc1_local + h) if bias else 0
    return float(weights + biases + 2 * norm_params_per_hidden * h)
