"""What a transformer block (attention, MLP, MoE) is made of on one rank.

A block knows its passes (forward, combined backward, input-gradient and
weight-gradient halves, what selective recompute re-runs), its parameters and the
tensors it saves for the backward pass. The helpers here are the pieces every block
uses: norms, bias-dropout-add, linear layers in their three backward forms, and the
tensor-parallel collectives around column- and row-parallel GEMMs (Shoeybi et al.
2019; with sequence parallelism, Korthikanti et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mpsim.workload.ops import Item, Op, Overlap, collective, gemm, memory_op


@dataclass(frozen=True)
class LayerContext:
    """Shapes of one layer on one rank, and the framework options that change its work."""

    microbatch_size: int
    seq_length: int  # the whole sequence (keys attend over all of it)
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # query/key head size
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
    # Megatron-Core --tp-comm-overlap: Transformer Engine's userbuffers overlap the
    # sequence-parallel collectives with the GEMMs beside them, forward and backward
    tp_overlap_forward: bool = False
    v_head_dim: int | None = None  # value head size when it differs (MLA)
    cp: int = 1
    cp_comm: str = "ring"
    ep: int = 1
    etp: int = 1
    causal: bool = True  # decoder self-attention masks future keys; encoders (ViT, wav2vec) attend to all
    fp8_attention: bool = False  # an fp8 run's attention core in fp8 too (Transformer Engine's fp8_dpa)
    fp8_current_scaling: bool = False  # Transformer Engine's Float8CurrentScaling (TrainingOptions.fp8_recipe)
    ffn_activation: str = ""  # gelu, swiglu, squared_relu or relu ("": swiglu when gated, else gelu)
    # whose layers run the model (TrainingOptions.transformer_impl): Megatron's own ("local"),
    # Transformer Engine's, or plain PyTorch modules under autograd ("pytorch")
    layers_impl: str = "local"
    # the norms' kernels (TrainingOptions.norm_kernel as resolved for the model's norm): "operators"
    # (RMSNorm as PyTorch's operators run it eagerly), "pytorch" (PyTorch's native kernel) or
    # "fused" (Apex, Transformer Engine, Triton): norms.py
    norm_kernel: str = "fused"
    norm_kind: str = "layernorm"  # model.norm
    cross_entropy_fusion: bool = False  # Megatron-Core's fused vocab-parallel cross entropy
    fp32_loss: bool = True  # the loss on an fp32 copy of the logits (TrainingOptions.fp32_loss)
    ub_sms: tuple[tuple[str, int], ...] = ()  # userbuffers SMs per GEMM site a recipe tunes (tp_comm_overlap_sms)
    activation_fusion: bool = True  # Megatron's fused bias + FFN activation kernels
    separate_ffn_projections: bool = False  # a gated FFN's gate and value as two linears (ffn_projections)
    moe_dispatcher: str = "alltoall"  # TrainingOptions.moe_token_dispatcher
    moe_dispatch_fp8: bool = False  # DeepEP's fp8 dispatch (TrainingOptions.moe_dispatch_fp8)
    moe_expert_gemms: str = "grouped"  # TrainingOptions.moe_expert_gemms: multi-stream or grouped
    cuda_graph_modules: tuple[str, ...] = ()  # TrainingOptions.cuda_graph_modules (workload/graphs.py)
    recompute_modules: tuple[str, ...] = ("core_attn",)  # ParallelPlan.recompute_modules, with recompute selective

    @property
    def bias_add_kernel(self) -> bool:
        """Megatron's local layers add the QKV bias after its GEMM; Transformer Engine and
        PyTorch's addmm add it in the GEMM's epilogue."""
        return self.layers_impl == "local"

    @property
    def bias_grad_kernel(self) -> bool:
        """Bias gradients summed in a reduction kernel of their own (all but Transformer
        Engine, whose backward GEMM's epilogue sums them)."""
        return self.layers_impl != "transformer_engine"

    @property
    def grad_accumulation_fused(self) -> bool:
        """Megatron accumulates a weight gradient in its GEMM (``--gradient-accumulation-fusion``:
        into the fp32 main_grad buffer); plain PyTorch writes it fresh and autograd's
        AccumulateGrad adds it into ``.grad`` in a kernel of its own."""
        return self.layers_impl != "pytorch"

    @property
    def fp8(self) -> bool:
        """An fp8 run: the layers' linear GEMMs take fp8 operands."""
        return self.gemm_in_bytes == 1

    @property
    def attention_dtype(self) -> str:
        """The attention core's precision: bf16 in an fp8 run unless fp8 attention is asked for."""
        return "bf16" if self.fp8 and not self.fp8_attention else ""

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch on this rank (the sequence is split over context parallelism)."""
        return self.microbatch_size * self.seq_length // self.cp

    @property
    def norm_tokens(self) -> int:
        """Tokens a norm / dropout sees: 1/tp of them under sequence parallelism."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @property
    def heads_local(self) -> int:
        return self.heads // self.tp

    @property
    def kv_local(self) -> int:
        return max(1, self.kv_heads // self.tp)

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def ffn_local(self) -> int:
        return self.ffn_hidden // self.tp

    @property
    def activation_message(self) -> float:
        """Bytes of a full [tokens, hidden] activation: the TP collective payload."""
        return float(self.tokens * self.hidden * self.act_bytes)

    @property
    def operand_message(self) -> float:
        """Bytes of a full [tokens, hidden] GEMM operand as a TP all-gather moves it.

        In an fp8 run Transformer Engine gathers what its fp8 GEMM reads, cast before the
        gather: the norm of a ``LayerNormLinear`` writes its output in fp8 and that is
        gathered, forward and again for the weight gradient; a row-parallel linear's
        output gradient is cast on its shard and gathered in fp8 (TE 1.x,
        ``grad_output_preprocess`` in ``module/base.py``, and ``initialize_ub``, whose
        all-gather buffers are fp8 "when using fp8 recipe"). Reduce-scatters stay bf16.
        """
        return float(self.tokens * self.hidden * (self.gemm_in_bytes if self.fp8 else self.act_bytes))


@dataclass(frozen=True)
class BlockWork:
    """One block of a layer on one rank, for one microbatch."""

    forward: tuple[Item, ...]
    backward: tuple[Item, ...]  # combined input + weight gradient
    backward_input: tuple[Item, ...]
    backward_weight: tuple[Item, ...]
    recompute_selective: tuple[Item, ...] = ()
    params: float = 0.0  # dense parameters on this rank (reduced over data parallelism)
    expert_params: float = 0.0  # expert parameters on this rank (reduced over the expert-DP group)
    saved_bytes: float = 0.0  # tensors kept from forward to backward
    selective_saved_bytes: float = 0.0  # of which selective recompute drops
    # op-level selective recompute (``parallel.recompute: selective-op``): what the backward runs
    # again, and what the forward keeps; None where the block's matmuls do not follow
    # torchtitan's pattern (mpsim/workload/op_recompute.py)
    recompute_op: tuple[Item, ...] | None = None
    op_saved_bytes: float = 0.0
    # Megatron-Core's other recompute modules (parallel.recompute_modules) in this block: (module,
    # what the backward runs again, bytes the forward then no longer keeps)
    recompute_parts: tuple[tuple[str, tuple[Item, ...], float], ...] = ()
    weight_grad_buffer_bytes: float = 0.0  # kept from I until W by a split backward
    notes: tuple[str, ...] = field(default_factory=tuple)
    # elements of each parameter tensor on this rank (dense and expert): plain PyTorch adds
    # each one's gradient into .grad in a kernel of its own (stage_work.unit_blocks)
    param_tensors: tuple[float, ...] = ()


def param_tensors(*elements: float) -> tuple[float, ...]:
    """A block's parameter tensors (``BlockWork.param_tensors``), the absent ones (0) left out."""
    return tuple(float(n) for n in elements if n > 0)


# an amax, as Transformer Engine keeps and reduces it: one float32
AMAX_BYTES = 4
# Transformer Engine's current-scaling quantize (Float8CurrentScalingQuantizer::quantize_impl in
# transformer_engine/pytorch/csrc/quantizer.cpp): zero the amax, find it, compute the scale
# (common/recipe/current_scaling.cu), then cast; with an amax the norm's or activation's own
# kernel wrote (quantize_with_amax), the scale and the cast
CURRENT_SCALING_CAST_KERNELS = 4
CURRENT_SCALING_CAST_WITH_AMAX_KERNELS = 2

# Transformer Engine's userbuffers defaults (transformer_engine/pytorch/module/base.py,
# initialize_ub): an all-gather that feeds a GEMM (qkv_fprop, fc1_fprop, proj_dgrad,
# fc2_dgrad) is a ring exchange in tp pieces on the copy engines (num_sm 1, no SM margin);
# a reduce-scatter fed by a GEMM (proj_fprop, fc2_fprop) is pipelined in 4 pieces on 16
# SMs set aside from the GEMM; the backward's bulk overlaps (qkv/fc1 dgrad and wgrad) take
# 16 SMs
UB_RING_EXCHANGE_SMS = 1
UB_PIPELINE_SPLITS = 4
UB_PIPELINE_SMS = 16
UB_BULK_SMS = 16


def tp_collectives(ctx: LayerContext, name: str, gathers_operand: bool = True) -> tuple[Op | None, Op | None]:
    """Collectives around a TP block: (before the column-parallel GEMM, after the row-parallel one).

    The all-gather carries the column-parallel GEMM's operand (``operand_message``: fp8 in
    an fp8 run) unless ``gathers_operand`` is false (a bf16 tensor gathered before a GEMM
    of its own, as MLA's down projection's input)."""
    if ctx.tp == 1:
        return None, None
    message = ctx.activation_message
    if ctx.sequence_parallel:
        gathered = ctx.operand_message if gathers_operand else message
        return (collective(f"{name}.all_gather", "all-gather", "tp", gathered),
                collective(f"{name}.reduce_scatter", "reduce-scatter", "tp", message))
    return None, collective(f"{name}.all_reduce", "all-reduce", "tp", message)


def grad_gather(ctx: LayerContext, name: str) -> Op | None:
    """Backward of a row-parallel GEMM's reduce-scatter: an all-gather of the gradient (in fp8
    in an fp8 run: cast on the shard, then gathered)."""
    if ctx.tp > 1 and ctx.sequence_parallel:
        return collective(f"{name}.grad_all_gather", "all-gather", "tp", ctx.operand_message)
    return None


def weight_pass_regather(ctx: LayerContext, name: str) -> Op | None:
    """A split backward's all-gather of a row-parallel GEMM's output gradient for its weight pass.

    Under sequence parallelism the output gradient arrives sharded and is all-gathered for
    the input gradient. A backward split into input and weight passes keeps it sharded
    until the weight pass and gathers it again there, as the Zero Bubble fork of Megatron
    does (``reshard_for_sequence_parallel`` in ``megatron/core/tensor_parallel/layers.py``,
    sail-sg/zero-bubble-pipeline-parallelism at 4769e08), the same way Megatron re-gathers a
    column-parallel GEMM's input: what waits for the weight pass is 1/tp of the tokens.
    """
    if ctx.tp > 1 and ctx.sequence_parallel:
        return collective(f"{name}.regather_grad", "all-gather", "tp", ctx.operand_message)
    return None


def ub_sms(ctx: LayerContext, layer: str, role: str, default: int) -> int:
    """The SMs Transformer Engine's userbuffers take at the GEMM site of ``layer`` ("attn.qkv",
    "mlp.fc2", ...) in ``role`` (fprop, dgrad, wgrad): the scenario's ``tp_comm_overlap_sms``
    where it names the site, else ``default``."""
    site = f"{layer.rsplit('.', 1)[-1]}_{role}"
    return next((sms for name, sms in ctx.ub_sms if name == site), default)


def gathered_gemm(ctx: LayerContext, gather: Op | None, gemm_op: Op) -> list[Item]:
    """A GEMM after the all-gather of its input: one after the other, or, with userbuffers,
    the GEMM on each piece as the ring exchange brings it.

    Under fp8 current scaling the shards are cast with one scale, so their amaxes are first
    all-reduced over TP (Transformer Engine sets the input quantizer's amax reduction group
    of a sequence-parallel column-parallel linear, and the output gradient's of a row-parallel
    one: ``set_quantizer_amax_reduction_group`` in ``module/linear.py``), on the compute
    stream before the cast."""
    if gather is None:
        return [gemm_op]
    amax = [collective(f"{gemm_op.name}.amax_all_reduce", "all-reduce", "tp", AMAX_BYTES)] \
        if ctx.fp8 and ctx.fp8_current_scaling and gemm_op.dtype == "" else []
    if ctx.tp_overlap_forward:
        layer, role = (gemm_op.name[:-6], "dgrad") if gemm_op.name.endswith(".dgrad") else (gemm_op.name, "fprop")
        return [*amax, Overlap(gather, (gemm_op,), chunks=ctx.tp, comm_first=True,
                               comm_sms=ub_sms(ctx, layer, role, UB_RING_EXCHANGE_SMS))]
    return [*amax, gather, gemm_op]


def scattered_gemm(ctx: LayerContext, gemm_op: Op, reduce: Op | None) -> list[Item]:
    """A GEMM before the reduce-scatter (or all-reduce) of its output: one after the other,
    or, with userbuffers, each piece reduce-scattered while the GEMM computes the next."""
    if reduce is None:
        return [gemm_op]
    if ctx.tp_overlap_forward and reduce.collective == "reduce-scatter":
        return [Overlap(reduce, (gemm_op,), chunks=UB_PIPELINE_SPLITS,
                        comm_sms=ub_sms(ctx, gemm_op.name, "fprop", UB_PIPELINE_SMS))]
    return [gemm_op, reduce]


def bias_dropout_add(ctx: LayerContext, name: str) -> Op:
    """Megatron's fused bias + dropout + residual add: read the branch and the residual, write
    the sum (and the dropout mask)."""
    elems = ctx.norm_tokens * ctx.hidden
    mask = 1 if ctx.dropout else 0
    return memory_op(name, elems * (3 * ctx.act_bytes + mask))


def bias_dropout_add_grad(ctx: LayerContext, name: str) -> list[Op]:
    """The backward of a residual connection.

    With dropout, the fused kernel's backward scales the gradient by the mask into the
    branch (read the gradient and the mask, write the branch's gradient); without it the
    add hands the gradient through unchanged, no kernel. Either way the block's input was
    used twice, by the branch (its norm) and by the residual, so autograd sums its two
    gradients in a kernel of its own (``InputBuffer`` accumulation: read both, write the
    sum), one per residual connection, as profiler traces of eager backwards show.
    """
    elems = ctx.norm_tokens * ctx.hidden
    e = ctx.act_bytes
    branch = [memory_op(f"{name}.grad", elems * (2 * e + 1))] if ctx.dropout else []
    return branch + [residual_grad(name, elems, e)]


def residual_grad(name: str, elements: float, act_bytes: int) -> Op:
    """Autograd's sum of a tensor's two gradients (through a branch and along the residual)."""
    return memory_op(f"{name}.residual_grad", elements * 3 * act_bytes)


def bias_add(ctx: LayerContext, name: str, tokens: int, width: int) -> list[Op]:
    """A column-parallel layer's bias added after its GEMM (Megatron's local layers: the output
    read and written again); nothing when the GEMM's epilogue adds it."""
    if not ctx.bias_add_kernel:
        return []
    return [memory_op(f"{name}.bias", 2.0 * tokens * width * ctx.act_bytes)]


def bias_grad(ctx: LayerContext, name: str, tokens: int, width: int) -> list[Op]:
    """A bias's gradient: the output gradient summed over the tokens, a reduction that reads it
    once (``grad_output.sum(dim=0)`` in Megatron's linear backward, or autograd's sum over a
    broadcast bias after a fused bias-GeLU / bias-dropout-add); nothing when the backward
    GEMM's epilogue sums it."""
    if not ctx.bias_grad_kernel:
        return []
    return [memory_op(f"{name}.bias.grad", float(tokens * width * ctx.act_bytes))]


def linear(ctx: LayerContext, name: str, m: int, n: int, k: int, batch: int = 1,
           fp8: bool = True, input_cast: bool = False, gathered_grad: bool = False,
           gathered_input: bool = False, in_sequence_parallel: bool = True) -> tuple[Op, Op, Op]:
    """(forward, input-gradient, weight-gradient) GEMMs of Y[m,n] = X[m,k] W[k,n].

    In an fp8 run a layer's linear GEMMs run in fp8 as Transformer Engine runs them, each
    cast a memory-bound kernel of its own beside its GEMM (TE 1.x, ``module/linear.py``,
    ``layernorm_linear.py``, ``layernorm_mlp.py``):

    - the input: where a norm or activation produces it (``LayerNormLinear``,
      ``LayerNormMLP``) that kernel writes it in fp8 and the weight gradient transposes it
      (``fp8_transpose``: read 1 byte, write 1 per element). A bf16 input
      (``input_cast``: the attention core's output into the output projection) is cast
      by the linear itself, with its transpose in the same kernel (read 2, write 1 + 1),
      or, under sequence parallelism, cast alone (read 2, write 1) and transposed for the
      weight gradient;
    - the output gradient: cast with a transposed copy before the input gradient
      (``cast_transpose``: read 2, write 1 + 1), which the weight gradient reuses; a
      row-parallel linear's (``gathered_grad``) under sequence parallelism arrives as a
      shard to gather: cast alone on the shard (read 2, write 1, 1/tp of the rows), then
      gathered in fp8 and transposed whole (``fp8_transpose``: read 1, write 1);
    - the weights: cast once per step (Megatron-Core passes ``is_first_microbatch``), left
      out.

    With current scaling (``fp8_current_scaling``, Transformer Engine's Float8CurrentScaling)
    a cast first reads its bf16 tensor for the amax (``nvte_compute_amax``: 2 bytes per
    element more for the output gradients and a bf16 input); a norm or activation writes bf16
    with its amax in the same kernel (``FUSED_NORM_AMAX_FP8``, ``FUSED_ACTIVATION_AMAX_FP8`` in
    TE's ``normalization.cpp`` and ``activation.cpp``), which the linear then quantizes with its
    transposed copy (read 2, write 1 + 1), or, where sequence parallelism gathers it
    (``gathered_input``: the column-parallel QKV and FC1), on the shard (read 2, write 1),
    transposed whole after the gather.

    ``fp8=False`` keeps a GEMM in bf16 (the LM head and the router, which Megatron does
    not run through Transformer Engine). ``in_sequence_parallel=False``: a linear outside the
    layer's sequence parallelism (the experts' GroupedLinear, on tokens the dispatch brought).
    """
    if ctx.fp8 and fp8:
        e, dtype = 1, ""
        x_elements = float(batch * m * k)
        sp = in_sequence_parallel and ctx.sequence_parallel and ctx.tp > 1
        if gathered_grad and sp:
            dy_cast = (3.0 / ctx.tp + 2.0) * batch * m * n
        else:
            dy_cast = 4.0 * batch * m * n
        split = input_cast and sp  # cast here, transposed later
        x_cast = (3.0 if split else 4.0) * x_elements if input_cast else 0.0
        x_transpose = 0.0 if input_cast and not split else 2.0 * x_elements
        if ctx.fp8_current_scaling:
            dy_cast += 2.0 * batch * m * n / (ctx.tp if gathered_grad and sp else 1)  # its amax pass
            if input_cast:
                x_cast += 2.0 * x_elements
            elif gathered_input and sp:
                x_cast = 3.0 * x_elements / ctx.tp
            else:
                x_cast, x_transpose = 4.0 * x_elements, 0.0
    else:
        e, dtype = (ctx.act_bytes, "bf16") if ctx.fp8 else (ctx.gemm_in_bytes, "")
        x_cast = dy_cast = x_transpose = 0.0
    fwd = gemm(name, m, n, k, batch=batch, in_bytes=e, out_bytes=ctx.act_bytes, dtype=dtype, cast_bytes=x_cast)
    dgrad = gemm(f"{name}.dgrad", m, k, n, batch=batch, in_bytes=e, out_bytes=ctx.act_bytes, dtype=dtype,
                 cast_bytes=dy_cast)
    # accumulated into the gradient buffer by the GEMM (read and written), or written fresh for
    # autograd to add (grad_accumulation_fused)
    fused = ctx.grad_accumulation_fused
    wgrad = gemm(f"{name}.wgrad", k, n, m, batch=batch, in_bytes=e,
                 out_bytes=0 if fused else ctx.wgrad_accumulate_bytes,
                 accumulate_bytes=ctx.wgrad_accumulate_bytes if fused else 0, dtype=dtype, cast_bytes=x_transpose)
    if ctx.fp8 and fp8 and ctx.fp8_current_scaling:
        # the casts' kernels (delayed scaling's cast_transpose is one)
        fwd = replace(fwd, cast_launches=CURRENT_SCALING_CAST_KERNELS if input_cast
                      else CURRENT_SCALING_CAST_WITH_AMAX_KERNELS)
        dgrad = replace(dgrad, cast_launches=CURRENT_SCALING_CAST_KERNELS)
    return fwd, dgrad, wgrad


def column_backward(ctx: LayerContext, name: str, dgrad: Op | tuple[Op, ...], wgrad: Op | tuple[Op, ...],
                    gather: Op | None) -> tuple[list[Item], list[Item], list[Item]]:
    """Backward of a column-parallel GEMM: (combined, input-only, weight-only) items.

    Its input gradient needs an all-reduce over TP (a reduce-scatter under sequence
    parallelism, which also re-gathers the sharded input for the weight gradient). In the
    combined form Megatron overlaps that collective with the weight-gradient GEMM (with
    userbuffers, Transformer Engine's bulk overlaps, on SMs of their own). ``dgrad`` and
    ``wgrad`` may be runs of ops: the GEMMs of several column-parallel layers of one input
    (and the sum of their input gradients), reduced once.
    """
    dgrads = dgrad if isinstance(dgrad, tuple) else (dgrad,)
    wgrads = wgrad if isinstance(wgrad, tuple) else (wgrad,)
    if ctx.tp == 1:
        return [*dgrads, *wgrads], [*dgrads], [*wgrads]
    kind = "reduce-scatter" if ctx.sequence_parallel else "all-reduce"
    reduce = collective(f"{name}.grad_{kind.replace('-', '_')}", kind, "tp", ctx.activation_message)
    # the weight gradient's input gathered again as the forward gathered it (fp8 where it was)
    regather = (collective(f"{name}.regather_input", "all-gather", "tp", gather.message_bytes)
                if gather is not None else None)
    if ctx.tp_overlap_backward or ctx.tp_overlap_forward:
        # with userbuffers, Transformer Engine's bulk overlaps: the input's gather beside the
        # input-gradient GEMM (the site's dgrad), the gradient's reduce-scatter beside the
        # weight-gradient GEMM (its wgrad); without, NCCL's channels
        dgrad_sms = ub_sms(ctx, name, "dgrad", UB_BULK_SMS) if ctx.tp_overlap_forward else None
        wgrad_sms = ub_sms(ctx, name, "wgrad", UB_BULK_SMS) if ctx.tp_overlap_forward else None
        combined: list[Item] = [*([Overlap(regather, dgrads, comm_sms=dgrad_sms)] if regather else dgrads),
                                Overlap(reduce, wgrads, comm_sms=wgrad_sms)]
    else:
        combined = ([regather] if regather else []) + [*dgrads, reduce, *wgrads]
    input_only: list[Item] = [*dgrads, reduce]
    weight_only: list[Item] = ([regather] if regather else []) + [*wgrads]
    return combined, input_only, weight_only


def present(*ops: Op | None) -> list[Item]:
    """The ops that exist (TP collectives vanish at tp=1)."""
    return [op for op in ops if op is not None]
