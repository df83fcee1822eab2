"""The dense feed-forward block on one rank: norm, FC1, activation, FC2 (Megatron TP).

FC1 is column-parallel and FC2 row-parallel, so the block needs one collective before
(an all-gather under sequence parallelism) and one after (all-reduce, or reduce-scatter
with sequence parallelism). SwiGLU's FC1 produces a gate and a value, twice the width.

The activation between them is one memory-bound kernel (fused, as Megatron-LM's
``bias_gelu`` / ``bias_swiglu`` and Transformer Engine's ``gelu`` / ``srelu`` / ``swiglu``
kernels are): what it reads and writes, and what it keeps for the backward pass, is in
:data:`FFN_ACTIVATIONS`. Its arithmetic is a few operations per element and is not
counted, as PyTorch's FLOP counter and the papers' model FLOPs do not count it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.workload.blocks import (BlockWork, LayerContext, bias_add, bias_dropout_add, bias_dropout_add_grad,
                                   bias_grad, column_backward, gathered_gemm, grad_gather, linear, param_tensors,
                                   present, scattered_gemm, tp_collectives, weight_pass_regather)
from mpsim.workload.norms import norm, norm_grad, norm_saved_bytes
from mpsim.workload.ops import Item, Op, memory_op
from mpsim.workload.op_recompute import mlp_op_recompute


@dataclass(frozen=True)
class FfnActivation:
    """An FFN activation per element of the FFN width on one rank, in activation-sized elements."""

    up_projections: int  # FC1 outputs per FFN column: 2 when gated (a gate and a value), else 1
    forward_traffic: int  # elements the fused forward kernel reads and writes
    backward_traffic: int  # elements its backward reads and writes
    saved: int  # elements kept for the backward pass, FC2's input (the activation's output) included
    forward_launches: int = 1  # kernels each pass launches (one when fused)
    backward_launches: int = 1
    # gated only: the gate and the value come from two linear layers of the same input, each a
    # GEMM and a weight of its own, rather than from one FC1 GEMM whose output is cut in two
    separate_projections: bool = False
    # (forward, backward) share of the streaming rate its kernels reach where a published sweep of
    # those very kernels measured it (benchmarks/memory_kernel_sweep.py); 1: the streaming rate
    bandwidth_share: tuple[float, float] = (1.0, 1.0)

    def fc1_tensors(self, elements: int) -> tuple[int, ...]:
        """FC1's ``elements`` weights (or bias entries) as parameter tensors: one, or the gate's and
        the value's."""
        parts = self.up_projections if self.separate_projections else 1
        return (elements // parts,) * parts


FFN_ACTIVATIONS = {
    # y = gelu(x): read x, write y; backward reads x and dy, writes dx; keeps x (for gelu'(x)) and y
    "gelu": FfnActivation(1, 2, 3, 2),
    # y = relu(x)^2 (So et al. 2021, Primer; Nemotron-4): dy/dx = 2 relu(x) needs the input, so the same
    # traffic and tensors as GeLU (Megatron-LM's squared_relu, Transformer Engine's srelu / dsrelu)
    "squared_relu": FfnActivation(1, 2, 3, 2),
    # y = relu(x): PyTorch's backward reads only the output (threshold_backward on the result), which
    # FC2 keeps as its input anyway, so one tensor is kept
    "relu": FfnActivation(1, 2, 3, 1),
    # y = silu(gate) * value: read both halves, write y; backward reads both and dy, writes both
    # gradients; keeps both halves and y
    "swiglu": FfnActivation(2, 3, 5, 3),
}


# The same written as plain PyTorch operators under autograd (``transformer_impl: pytorch``), one
# kernel per operator; GeLU and ReLU are one operator each and cost what the fused kernels cost.
PLAIN_FFN_ACTIVATIONS = {
    # y = silu(gate) * value after FC1's output is chunked in two: forward silu (read the gate,
    # write silu: 2) and the product (read both, write y: 3), 5; backward the product's two
    # gradients (dy x value and dy x silu: 3 each), silu's backward (read its gradient and the
    # gate, write the gate's gradient: 3) and the chunk's backward, a cat of the two gradients into
    # FC1's output gradient (2 + 2): 13 in four kernels; kept: FC1's output (both halves), silu's
    # output for the product's backward, and y
    # Liger-Kernel's sweep of this very form (megatron_swiglu / torch: silu(y1) * y2 over torch.chunk
    # of a bf16 FC1 output, 8,192 tokens, H100; LIGER-BENCH in docs/hardware-sources.md) at its
    # widest FFN (32,768): 0.578 of the streaming rate forward (the halves are strided views, which
    # PyTorch's elementwise kernels do not vectorize), 0.730 backward over these 13 elements, where
    # the benchmark's backward, from a sum of the output, reads its one-value gradient from no
    # memory and moved 12: 0.674 over the bytes it moved, the share a backward of 13 runs at
    "swiglu": FfnActivation(2, 5, 13, 4, forward_launches=2, backward_launches=4, bandwidth_share=(0.578, 0.674)),
    # y = relu(x) ** 2 (Hugging Face's relu2, NeMo's squared_relu): relu (2) and the power (2)
    # forward; the power's backward is autograd's pow_backward, grad * (2 * r.pow(1)) with r relu's
    # output (torch/csrc/autograd/FunctionsManual.cpp): r.pow(1) copies r (2), the scaling by 2
    # reads and writes it (2), the product with dy reads both and writes (3); then relu's backward
    # (threshold_backward on its output: 3). 10 in four kernels; kept: relu's output and y
    # The same sweep's torch.square(relu(x)) on bf16 over 4,096 rows (H100), at its widest row
    # (32,768): 0.949 forward, 0.969 backward (timed alone), contiguous operators near the streaming rate
    "squared_relu": FfnActivation(1, 4, 10, 2, forward_launches=2, backward_launches=4,
                                  bandwidth_share=(0.949, 0.969)),
}
# Plain PyTorch models write the gated FFN as two linear layers of the same input, the gate and the
# value, then silu(gate) * value (Hugging Face's LlamaMLP: gate_proj and up_proj; torchtitan's
# FeedForward: w1 and w3): forward silu (2) and the product (3), 5 in two kernels; backward the
# product's two gradients (3 each) and silu's backward (3), 9 in three kernels, with no cut to undo.
# Kept as above. The two projections' input gradients are summed by autograd (mlp_items).
PYTORCH_FFN_ACTIVATIONS = {
    "swiglu": FfnActivation(2, 5, 9, 4, forward_launches=2, backward_launches=3, separate_projections=True),
}


def ffn_activation(ctx: LayerContext) -> FfnActivation:
    """The activation of a layer's dense FFN.

    A context that names its activation (``ffn_activation``) gets that one; otherwise the
    gated flag decides between SwiGLU and GeLU, whose costs squared ReLU shares. Plain
    PyTorch (``layers_impl`` pytorch), and Megatron without its activation fusion
    (``activation_fusion`` off), run the gated and squared forms operator by operator
    (:data:`PLAIN_FFN_ACTIVATIONS`), the gated one from two projections where the model
    writes them so (``separate_ffn_projections``: :data:`PYTORCH_FFN_ACTIVATIONS`).
    """
    name = ctx.ffn_activation or ("swiglu" if ctx.gated_ffn else "gelu")
    if ctx.separate_ffn_projections and name in PYTORCH_FFN_ACTIVATIONS:
        return PYTORCH_FFN_ACTIVATIONS[name]
    if (ctx.layers_impl == "pytorch" or not ctx.activation_fusion) and name in PLAIN_FFN_ACTIVATIONS:
        return PLAIN_FFN_ACTIVATIONS[name]
    return FFN_ACTIVATIONS[name]


def activation_ops(name: str, elements: float, act_bytes: int, activation: FfnActivation) -> tuple[Op, Op]:
    """The activation's forward and backward over ``elements`` FFN columns x tokens."""
    forward_share, backward_share = activation.bandwidth_share
    return (memory_op(name, elements * act_bytes * activation.forward_traffic, launches=activation.forward_launches,
                      bandwidth_share=forward_share),
            memory_op(f"{name}.grad", elements * act_bytes * activation.backward_traffic,
                      launches=activation.backward_launches, bandwidth_share=backward_share))


def fc1_gemms(ctx: LayerContext, name: str, rows: int, ffn_local: int, activation: FfnActivation, batch: int = 1,
              gathered_input: bool = False, input_cast: bool = False, in_sequence_parallel: bool = True
              ) -> tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]:
    """FC1's (forward, input-gradient, weight-gradient) ops over ``rows`` tokens (each of ``batch``
    experts' grouped GEMMs): one GEMM of the packed width, or, with ``separate_projections``, the
    gate's and the value's on the same input, whose input gradients autograd sums (read both,
    write one). ``gathered_input``: sequence parallelism gathers the input; ``input_cast``: it
    arrives in bf16 for the linear to cast; ``in_sequence_parallel``: ``blocks.linear``'s."""
    h = ctx.hidden
    cast = {"input_cast": input_cast, "in_sequence_parallel": in_sequence_parallel}
    if not activation.separate_projections:
        return tuple(zip(linear(ctx, f"{name}.fc1", rows, ffn_local * activation.up_projections, h, batch=batch,
                                gathered_input=gathered_input, **cast)))
    gate = linear(ctx, f"{name}.fc1", rows, ffn_local, h, batch=batch, gathered_input=gathered_input, **cast)
    value = linear(ctx, f"{name}.fc1_up", rows, ffn_local, h, batch=batch, gathered_input=gathered_input, **cast)
    grad_sum = memory_op(f"{name}.fc1.grad_sum", batch * rows * h * ctx.act_bytes * 3)
    return (gate[0], value[0]), (gate[1], value[1], grad_sum), (gate[2], value[2])


def mlp_items(ctx: LayerContext, name: str, ffn_local: int, tokens: int | None = None, bias: bool = False
              ) -> tuple[list[Item], list[Item], list[Item], list[Item], float, float, float,
                         tuple[tuple[Item, ...], float]]:
    """FC1 -> activation -> FC2 of width ``ffn_local`` per rank, with its TP collectives.

    With ``bias`` the backward sums both biases' gradients (FC1's after the fused
    bias-activation's backward, FC2's from the bias-dropout-add's, on its sequence-parallel
    tokens) where the framework runs those sums as kernels of their own.

    Returns (forward, combined backward, input-gradient, weight-gradient items, params,
    saved bytes, weight-gradient buffer bytes, and what op-level selective recompute runs
    again and keeps), without the norm and residual around it.
    """
    t, h, e = tokens or ctx.tokens, ctx.hidden, ctx.act_bytes
    activation = ffn_activation(ctx)
    fc1_width = ffn_local * activation.up_projections
    gather, reduce = tp_collectives(ctx, name)
    fc2, fc2_dgrad, fc2_wgrad = linear(ctx, f"{name}.fc2", t, h, ffn_local, gathered_grad=True)
    act, act_grad = activation_ops(f"{name}.act", t * ffn_local, e, activation)
    # the input gradients (summed where FC1 is two GEMMs) are reduced over TP once
    fc1s, fc1_dgrads, fc1_wgrads = fc1_gemms(ctx, name, t, ffn_local, activation, gathered_input=True)
    fc1_b, fc1_i, fc1_w = column_backward(ctx, f"{name}.fc1", fc1_dgrads, fc1_wgrads, gather)
    head = ((bias_grad(ctx, f"{name}.fc2", ctx.norm_tokens, h) if bias else [])
            + gathered_gemm(ctx, grad_gather(ctx, f"{name}.fc2"), fc2_dgrad))
    act_grads = [act_grad, *(bias_grad(ctx, f"{name}.fc1", t, fc1_width) if bias else [])]
    # without the fusion Megatron's local layers add FC1's bias in a kernel of its own before the
    # activation (MLP.forward: intermediate + bias); Transformer Engine's GEMM epilogue adds it
    fc1_bias = bias_add(ctx, f"{name}.fc1", t, fc1_width) if bias and not ctx.activation_fusion else []
    forward = [*gathered_gemm(ctx, gather, fc1s[0]), *fc1s[1:], *fc1_bias, act, *scattered_gemm(ctx, fc2, reduce)]
    backward = [*head, fc2_wgrad, *act_grads, *fc1_b]
    backward_input = [*head, *act_grads, *fc1_i]
    # a split backward's weight pass: FC2's output gradient gathered again, then FC1's input
    backward_weight = [*present(weight_pass_regather(ctx, f"{name}.fc2")), fc2_wgrad, *fc1_w]
    params = h * fc1_width + ffn_local * h
    saved = t * ffn_local * e * activation.saved  # what the activation keeps, FC2's input
    # kept from the input pass to the weight pass: the GEMMs' inputs and output gradients, FC1's
    # input and FC2's output gradient as they arrive (1/tp of the tokens under sequence
    # parallelism; both are gathered again for the weight pass)
    arriving = ctx.norm_tokens if tokens is None else t
    wbuf = (arriving * h + t * ffn_local) * e + (t * fc1_width + arriving * h) * e
    op_recompute = mlp_op_recompute(ctx, gather, reduce, fc1s, act, fc1_width)
    return forward, backward, backward_input, backward_weight, float(params), float(saved), float(wbuf), op_recompute


def mlp_block(ctx: LayerContext, bias: bool, norm_params: int) -> BlockWork:
    """The dense MLP half of a layer on one rank."""
    forward, backward, backward_input, backward_weight, params, saved, wbuf, (op_redo, op_saved) = mlp_items(
        ctx, "mlp", ctx.ffn_local, bias=bias)
    activation_kept = saved
    h, local, e = ctx.hidden, ctx.norm_tokens, ctx.act_bytes
    mask = 1 if ctx.dropout else 0
    activation = ffn_activation(ctx)
    fc1_width = ctx.ffn_local * activation.up_projections
    params += (fc1_width + h if bias else 0) + norm_params * h
    fc1_biases = activation.fc1_tensors(fc1_width) if bias else ()
    tensors = (*activation.fc1_tensors(h * fc1_width), ctx.ffn_local * h, *fc1_biases, *((h,) if bias else ()),
               *(h,) * norm_params)
    saved += 2 * local * h * e + local * h * mask + norm_saved_bytes(ctx)  # norm input, FC1 input, dropout mask
    norm_in, norm_w = norm_grad(ctx, "mlp.norm")
    # layernorm recompute: only Megatron's local layers keep the pre-MLP norm a module of its own
    # (Transformer Engine fuses it into LayerNormMLP)
    separate_norm = ctx.layers_impl == "local"
    parts = (("layernorm", (norm(ctx, "mlp.norm"),), float(local * h * e)),) if separate_norm else ()
    # mlp recompute (a checkpoint of the MLP module, which keeps its input): what the activation
    # keeps, and, where Transformer Engine's LayerNormMLP holds the norm, FC1's input too
    mlp_items_redo = tuple(forward) if separate_norm else (norm(ctx, "mlp.norm"), *forward)
    parts += (("mlp", mlp_items_redo, float(activation_kept + (0 if separate_norm else local * h * e))),)
    return BlockWork(
        forward=(norm(ctx, "mlp.norm"), *forward, bias_dropout_add(ctx, "mlp.bda")),
        backward=(*bias_dropout_add_grad(ctx, "mlp.bda"), *backward, *norm_in, *norm_w),
        backward_input=(*bias_dropout_add_grad(ctx, "mlp.bda"), *backward_input, *norm_in),
        backward_weight=(*backward_weight, *norm_w),
        params=params, saved_bytes=saved, weight_grad_buffer_bytes=wbuf,
        param_tensors=param_tensors(*tensors), recompute_op=(norm(ctx, "mlp.norm"), *op_redo), op_saved_bytes=op_saved,
        recompute_parts=parts)
