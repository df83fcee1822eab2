"""Each layer kind of a stack as ops on one rank: forward, input gradient, weight gradient.

A layer becomes a :class:`~mpsim.workload.blocks.BlockWork` like a transformer block:
its forward items, its backward as a whole and split into the input-gradient and
weight-gradient halves (for zero-bubble schedules), its parameters on the rank, the bytes
its backward needs kept, and what a split backward holds from ``I`` until ``W``. The
tensor-parallel mode (``mpsim/specs/stack_tp.py``) decides the shapes on the rank and
the collectives: a column layer is preceded by the all-gather of sequence parallelism
and its input gradient reduced over TP; a row layer ends with the all-reduce (or
reduce-scatter) that joins the partial outputs. Linear layers, attention, the embedding
and the loss reuse the transformer's own pieces, so a transformer written as a stack
costs exactly what the transformer model costs.

Every number is for one microbatch of ``microbatch_size`` samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mpsim.specs.layers import (AttentionLayer, ConvLayer, CrossEntropyLayer, CustomLayer, ElementwiseLayer,
                                EmbeddingLayer, LinearLayer, NormLayer, PoolLayer, RecurrentLayer, ViewLayer, numel)
from mpsim.specs.parallel import resolve_norm_kernel
from mpsim.specs.stack import PlacedLayer
from mpsim.workload.attention import self_attention
from mpsim.workload.blocks import (BlockWork, LayerContext, bias_grad, column_backward, gathered_gemm, grad_gather,
                                   linear, param_tensors, present, residual_grad, scattered_gemm, tp_collectives,
                                   weight_pass_regather)
from mpsim.workload.norms import norm_passes, norm_saved_extra
from mpsim.workload.embedding import cross_entropy_implementation, embedding_block, loss_items
from mpsim.workload.ops import Item, Op, collective, memory_op
from mpsim.workload.recurrent import recurrent_work


@dataclass(frozen=True)
class StackEnv:
    """What besides a layer's own shape decides its work on one rank."""

    microbatch_size: int
    tp: int
    sequence_parallel: bool
    flash_attention: bool  # training.attention, for attention layers with kernel: auto
    act_bytes: int = 2
    gemm_in_bytes: int = 2
    wgrad_accumulate_bytes: int = 4
    tp_overlap_backward: bool = True
    tp_overlap_forward: bool = False
    layers_impl: str = "local"  # LayerContext.layers_impl
    cross_entropy_fusion: bool = False  # LayerContext.cross_entropy_fusion
    fp32_loss: bool = True  # LayerContext.fp32_loss
    norm_kernel: str | None = None  # TrainingOptions.norm_kernel as given (None: the layers' own)

    @property
    def grad_accumulation_fused(self) -> bool:
        """As ``LayerContext.grad_accumulation_fused``."""
        return self.layers_impl != "pytorch"

    def context(self, tokens: int, hidden: int, **shape) -> LayerContext:
        """The transformer helpers' context for ``tokens`` per sample of width ``hidden``."""
        fields = dict(microbatch_size=self.microbatch_size, seq_length=tokens, hidden=hidden, heads=1, kv_heads=1,
                      head_dim=1, ffn_hidden=hidden, gated_ffn=False, tp=self.tp,
                      sequence_parallel=self.sequence_parallel, flash_attention=self.flash_attention, dropout=False,
                      rope=False, act_bytes=self.act_bytes, gemm_in_bytes=self.gemm_in_bytes,
                      wgrad_accumulate_bytes=self.wgrad_accumulate_bytes, tp_overlap_backward=self.tp_overlap_backward,
                      tp_overlap_forward=self.tp_overlap_forward, layers_impl=self.layers_impl)
        fields.update(shape)
        return LayerContext(**fields)


def tokens_of(shape: tuple[int, ...]) -> int:
    """Rows of a ``(..., features)`` tensor: every dimension but the last."""
    return math.prod(shape[:-1])


def local_elements(env: StackEnv, shape: tuple[int, ...], mode: str) -> int:
    """Elements of a microbatch's activation on one rank: split by features (shard) or tokens (SP)."""
    elements = env.microbatch_size * numel(shape)
    return elements // env.tp if mode == "shard" or (mode == "whole" and env.sequence_parallel) else elements


def layer_work(env: StackEnv, placed: PlacedLayer, mode: str, first: bool = False) -> BlockWork:
    """One layer of a stack on one rank, for one microbatch.

    The ``first`` layer of a stack reads the data, which needs no gradient: its backward
    computes only the weight gradient (as PyTorch skips inputs that do not require grad).
    """
    work = _layer_work(env, placed, mode)
    if not first:
        return work
    label = placed.label
    # the GEMMs that would produce the data's gradient (a deep RNN's upper layers and its
    # recurrence still need theirs)
    names = {f"{label}.dgrad", f"{label}.l0.input_proj.dgrad", f"{label}.l0.reverse.input_proj.dgrad"}
    dgrads = {op for op in work.backward_input if isinstance(op, Op) and op.name in names}
    if not dgrads or isinstance(placed.layer, CustomLayer):
        return work
    keep = lambda items: tuple(item for item in items if item not in dgrads)  # noqa: E731
    return replace(work, backward=keep(work.backward), backward_input=keep(work.backward_input))


def _layer_work(env: StackEnv, placed: PlacedLayer, mode: str) -> BlockWork:
    layer = placed.layer
    if isinstance(layer, LinearLayer):
        return _linear(env, placed, layer, mode)
    if isinstance(layer, ConvLayer):
        return _conv(env, placed, layer, mode)
    if isinstance(layer, RecurrentLayer):
        return recurrent_work(env, placed.label, layer, placed.in_shape)
    if isinstance(layer, AttentionLayer):
        tokens, features = placed.in_shape
        heads, kv_heads, head_dim = layer.dims(features)
        flash = env.flash_attention if layer.kernel == "auto" else layer.kernel == "flash"
        ctx = env.context(tokens, features, heads=heads, kv_heads=kv_heads, head_dim=head_dim, rope=layer.rope,
                          dropout=layer.dropout > 0, causal=layer.causal, flash_attention=flash)
        return self_attention(ctx, None, layer.bias)
    if isinstance(layer, EmbeddingLayer):
        tokens, dim = placed.out_shape
        ctx = env.context(tokens, dim, dropout=layer.dropout > 0)
        work = embedding_block(ctx, layer.num_embeddings // env.tp, learned_positions=layer.positions > 0)
        params = layer.num_embeddings // env.tp * dim + layer.positions * dim
        tensors = (layer.num_embeddings // env.tp * dim, *((layer.positions * dim,) if layer.positions else ()))
        return replace(work, params=float(params), param_tensors=param_tensors(*tensors))
    if isinstance(layer, CrossEntropyLayer):
        return _cross_entropy(env, placed, mode)
    if isinstance(layer, CustomLayer):
        return _custom(env, placed, layer)
    if isinstance(layer, ViewLayer):
        return BlockWork((), (), (), ())
    return _memory_bound(env, placed, mode)


def _linear(env: StackEnv, placed: PlacedLayer, layer: LinearLayer, mode: str) -> BlockWork:
    """Column-, row-parallel or replicated ``y = x W``, as Megatron's linear layers.

    A bias is added where the output is used next (fused into the activation or the
    bias-dropout-add, as Megatron's MLP does, or in the GEMM's epilogue as PyTorch's addmm
    does); its gradient is summed over the tokens in a kernel of its own unless the
    framework's GEMM epilogue sums it (``bias_grad``).
    """
    inputs, outputs = placed.in_shape[-1], layer.out_features
    tokens = tokens_of(placed.in_shape)
    rows = env.microbatch_size * tokens
    e, name = env.act_bytes, placed.label
    if mode == "column":
        ctx = env.context(tokens, inputs)  # the gathered input: the collectives' payload
        width = outputs // env.tp
        fwd, dgrad, wgrad = linear(ctx, name, rows, width, inputs, gathered_input=True)
        gather, _ = tp_collectives(ctx, name)
        combined, input_only, weight_only = column_backward(ctx, name, dgrad, wgrad, gather)
        if layer.bias:
            sums = bias_grad(ctx, name, rows, width)
            combined, input_only = sums + combined, sums + input_only
        forward: list[Item] = gathered_gemm(ctx, gather, fwd)
        params = inputs * width + (width if layer.bias else 0)
        # the input is kept as it arrives: 1/tp of the tokens under sequence parallelism
        saved = ctx.norm_tokens * inputs * e
        buffer = saved + rows * width * e  # the input as kept (gathered again for the weight pass), the output gradient
        return BlockWork(tuple(forward), tuple(combined), tuple(input_only), tuple(weight_only),
                         params=float(params), saved_bytes=float(saved), weight_grad_buffer_bytes=float(buffer),
                         param_tensors=param_tensors(inputs * width, width if layer.bias else 0))
    if mode == "row":
        ctx = env.context(tokens, outputs)  # the reduced output
        depth = inputs // env.tp
        fwd, dgrad, wgrad = linear(ctx, name, rows, outputs, depth, gathered_grad=True)
        _, reduce = tp_collectives(ctx, name)
        # the bias is added after the reduction, on the sequence-parallel tokens
        head = ((bias_grad(ctx, name, ctx.norm_tokens, outputs) if layer.bias else [])
                + gathered_gemm(ctx, grad_gather(ctx, name), dgrad))
        params = depth * outputs + (outputs if layer.bias else 0)  # the bias is added once, after the reduction
        # a split backward keeps the output gradient as it arrives and gathers it again for the weight pass
        weight = (*present(weight_pass_regather(ctx, name)), wgrad)
        return BlockWork(tuple(scattered_gemm(ctx, fwd, reduce)), (*head, wgrad), tuple(head),
                         weight, params=float(params), saved_bytes=float(rows * depth * e),
                         weight_grad_buffer_bytes=float((rows * depth + ctx.norm_tokens * outputs) * e),
                         param_tensors=param_tensors(depth * outputs, outputs if layer.bias else 0))
    ctx = env.context(tokens, inputs)
    fwd, dgrad, wgrad = linear(ctx, name, rows, outputs, inputs)
    params = inputs * outputs + (outputs if layer.bias else 0)
    sums = bias_grad(ctx, name, rows, outputs) if layer.bias else []
    return BlockWork((fwd,), (*sums, dgrad, wgrad), (*sums, dgrad), (wgrad,), params=float(params),
                     saved_bytes=float(rows * inputs * e), weight_grad_buffer_bytes=float(rows * (inputs + outputs) * e),
                     param_tensors=param_tensors(inputs * outputs, outputs if layer.bias else 0))


def _conv(env: StackEnv, placed: PlacedLayer, layer: ConvLayer, mode: str) -> BlockWork:
    """A convolution as the implicit GEMM cuDNN runs: rows are output positions, depth is channels x kernel."""
    b, e, name = env.microbatch_size, env.act_bytes, placed.label
    channels, out_channels = placed.in_shape[0], layer.out_channels
    kernel = math.prod(layer.geometry()[0])
    groups = layer.groups
    if mode == "column":
        out_channels //= env.tp
    elif mode == "row":
        channels //= env.tp
    positions_in, positions_out = numel(placed.in_shape[1:]), numel(placed.out_shape[1:])
    depth = channels // groups * kernel
    weights = out_channels * depth
    flops = 2.0 * b * positions_out * weights
    in_bytes = b * positions_in * channels * e
    out_bytes = b * positions_out * out_channels * e
    w_bytes = weights * env.gemm_in_bytes
    # read-modify-write of the accumulated weight gradient, or a fresh one for autograd to add
    acc = (2 if env.grad_accumulation_fused else 1) * env.wgrad_accumulate_bytes * weights
    fwd = Op(name, "gemm", flops=flops, bytes=float(in_bytes + w_bytes + out_bytes),
             shape=(groups, b * positions_out, out_channels // groups, depth))
    dgrad = Op(f"{name}.dgrad", "gemm", flops=flops, bytes=float(out_bytes + w_bytes + in_bytes),
               shape=(groups, b * positions_in, channels // groups, out_channels // groups * kernel))
    # the weight gradient reduces over every output position into a small (depth x channels)
    # result, which the library splits (split-K) so that enough tiles run at once: the compute
    # model prices that split (mpsim/cost/compute.py)
    wgrad = Op(f"{name}.wgrad", "gemm", flops=flops, bytes=float(in_bytes + out_bytes + acc),
               shape=(groups, depth, out_channels // groups, b * positions_out))
    forward: list[Item] = [fwd]
    backward: list[Item] = [dgrad, wgrad]
    backward_input: list[Item] = [dgrad]
    if mode == "row":  # partial outputs of the input-channel slices are summed
        forward.append(collective(f"{name}.all_reduce", "all-reduce", "tp", b * numel(placed.out_shape) * e))
    if mode == "column":  # the input gradient is a sum over the output-channel slices
        reduce = collective(f"{name}.grad_all_reduce", "all-reduce", "tp", b * numel(placed.in_shape) * e)
        backward, backward_input = [dgrad, reduce, wgrad], [dgrad, reduce]
    params = weights + (out_channels if layer.bias else 0)
    return BlockWork(tuple(forward), tuple(backward), tuple(backward_input), (wgrad,), params=float(params),
                     saved_bytes=float(in_bytes), weight_grad_buffer_bytes=float(in_bytes + out_bytes),
                     param_tensors=param_tensors(weights, out_channels if layer.bias else 0))


# HBM traffic per element of the output, in activation sizes: (forward, backward, kept for
# the backward); dropout masks add a byte per element on top
ELEMENTWISE_TRAFFIC = {
    "activation": (2, 3, 1),  # read x, write y; read x and dy, write dx; keep x
    "gated": (3, 5, 2),  # SwiGLU/GeGLU: read gate and value, write y; keep both halves
    "dropout": (2, 2, 0),
    # residual connections: their backward is ``residual_backward``
    "add": (3, 0, 0),  # the add itself hands the same gradient to both inputs
    "bias_dropout_add": (3, 2, 0),  # Megatron's fused kernel; with dropout its backward scales by the mask
    "scale": (2, 2, 0),
}


def _memory_bound(env: StackEnv, placed: PlacedLayer, mode: str) -> BlockWork:
    """Norms, elementwise ops and pooling: they stream their bytes, no FLOPs to speak of."""
    layer, e, name = placed.layer, env.act_bytes, placed.label
    if isinstance(layer, NormLayer):
        elements = local_elements(env, placed.in_shape, mode)
        params = layer.params(placed.in_shape) // (env.tp if mode == "shard" else 1)
        halves = 1 if layer.kind == "rmsnorm" or not layer.bias else 2  # scale, and shift
        # batch and group norms: cuDNN's and PyTorch's kernels, which no sweep here times apart
        kernel = resolve_norm_kernel(env.norm_kernel, layer.kind, env.layers_impl) \
            if layer.kind in ("layernorm", "rmsnorm") else "fused"
        # "operators": an RMSNorm module in PyTorch's operators (the layout checks allow RMSNorm only)
        forward, grad_in, grad_w = norm_passes(name, elements, e, env.layers_impl, kernel, layer.kind)
        return BlockWork((forward,), (*grad_in, *grad_w), tuple(grad_in), tuple(grad_w), params=float(params),
                         saved_bytes=float(elements * (e + norm_saved_extra(kernel))),
                         param_tensors=(float(params // halves),) * halves)
    if isinstance(layer, PoolLayer):
        if layer.mode == "first":
            return BlockWork((), (), (), ())
        elements_in = local_elements(env, placed.in_shape, mode)
        elements_out = local_elements(env, placed.out_shape, mode)
        traffic = (elements_in + elements_out) * e
        kept = elements_out * 8 if layer.mode == "max" else 0  # max pooling keeps the argmax indices
        return BlockWork((memory_op(name, traffic),), (memory_op(f"{name}.grad", traffic),),
                         (memory_op(f"{name}.grad", traffic),), (), saved_bytes=float(kept))
    assert isinstance(layer, ElementwiseLayer)
    if layer.op == "dropout" and layer.dropout == 0:
        return BlockWork((), (), (), ())
    kind = {"swiglu": "gated", "geglu": "gated"}.get(layer.op, layer.op)
    fwd_per, bwd_per, kept_per = ELEMENTWISE_TRAFFIC.get(kind, ELEMENTWISE_TRAFFIC["activation"])
    elements = local_elements(env, placed.out_shape, mode)
    mask = 1 if layer.dropout > 0 and layer.op in ("dropout", "bias_dropout_add") else 0
    forward = memory_op(name, elements * (fwd_per * e + mask))
    if kind in ("add", "bias_dropout_add"):
        # as the transformer's residual connections (blocks.bias_dropout_add_grad): the mask's
        # scaling only with dropout, and autograd's sum of the residual input's two gradients
        scaled = (memory_op(f"{name}.grad", elements * (bwd_per * e + mask)),) if mask else ()
        backward = (*scaled, residual_grad(name, elements, e))
    else:
        backward = (memory_op(f"{name}.grad", elements * (bwd_per * e + mask)),) if bwd_per else ()
    params = layer.params // (env.tp if mode == "shard" else 1)
    return BlockWork((forward,), backward, backward, (), params=float(params), param_tensors=param_tensors(params),
                     saved_bytes=float(elements * (kept_per * e + mask)))


def _cross_entropy(env: StackEnv, placed: PlacedLayer, mode: str) -> BlockWork:
    """Softmax cross entropy as the LM head's (``loss_items``); on classes split over TP, the
    vocab-parallel form."""
    classes, tokens = placed.in_shape[-1], tokens_of(placed.in_shape)
    rows = env.microbatch_size * tokens
    split = mode == "vocab" and env.tp > 1
    implementation = cross_entropy_implementation(env.layers_impl, env.cross_entropy_fusion)
    forward, grad, kept = loss_items(placed.label, rows, rows * (classes // env.tp if split else classes),
                                     env.act_bytes, implementation, env.fp32_loss, env.tp if split else 1)
    return BlockWork(tuple(forward), (grad,), (grad,), (), saved_bytes=float(kept))


def _custom(env: StackEnv, placed: PlacedLayer, layer: CustomLayer) -> BlockWork:
    """A layer given by its costs, priced like a GEMM producing its output (compute- or memory-bound)."""
    b, e, name = env.microbatch_size, env.act_bytes, placed.label
    # the larger of its input and output stands for the GEMM's output (a loss ends in a scalar)
    out = max(placed.in_shape, placed.out_shape or (1,), key=numel)
    traffic = layer.bytes if layer.bytes is not None else \
        (numel(placed.in_shape) + numel(placed.out_shape)) * e + layer.params * env.gemm_in_bytes
    backward_flops = layer.backward_flops if layer.backward_flops is not None else 2 * layer.forward_flops
    weight_share = layer.weight_grad_fraction if layer.params > 0 else 0.0

    def op(label: str, flops: float, bytes_moved: float) -> Op:
        if flops <= 0:
            return memory_op(label, b * bytes_moved)
        rows, width = b * tokens_of(out), out[-1]
        depth = max(1, round(b * flops / (2 * rows * width)))  # the GEMM that does this work on this output
        return Op(label, "gemm", flops=b * flops, bytes=b * bytes_moved, shape=(1, rows, width, depth))

    fwd = op(name, layer.forward_flops, traffic)
    # the backward moves twice the forward's bytes, shared like its FLOPs
    dgrad = op(f"{name}.dgrad", backward_flops * (1 - weight_share), 2 * traffic * (1 - weight_share))
    weight = (op(f"{name}.wgrad", backward_flops * weight_share, 2 * traffic * weight_share),) if weight_share else ()
    kept = layer.activation_bytes if layer.activation_bytes is not None else numel(placed.in_shape) * e
    # its parameters taken as one tensor: a custom layer does not say how they are split
    return BlockWork((fwd,), (dgrad, *weight), (dgrad,), weight, params=float(layer.params),
                     saved_bytes=float(b * kept), weight_grad_buffer_bytes=float(b * kept) if weight else 0.0,
                     param_tensors=param_tensors(layer.params))


def forward_flops_per_sample(placed: PlacedLayer) -> float:
    """Forward FLOPs of one sample through one layer on one device (no TP), attention unmasked.

    The convention of model FLOPs (and of PyTorch's FLOP counter): matrix products and
    convolutions count, elementwise work does not, and attention counts its whole score
    matrix even when a causal mask lets the kernel skip half of it.
    """
    env = StackEnv(microbatch_size=1, tp=1, sequence_parallel=False, flash_attention=False)
    layer = placed.layer
    if isinstance(layer, AttentionLayer) and layer.causal:
        placed = PlacedLayer(layer.model_copy(update={"causal": False}), placed.path, placed.label,
                             placed.in_shape, placed.out_shape)
    mode = "vocab" if isinstance(layer, EmbeddingLayer) else "whole"
    if isinstance(layer, (LinearLayer, ConvLayer, CustomLayer)):
        mode = "replicate"
    work = layer_work(env, placed, mode)
    return sum(op.flops for op in work.forward if isinstance(op, Op) and op.kind != "memory")
