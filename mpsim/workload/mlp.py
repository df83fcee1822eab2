"""The dense feed-forward block on one rank: norm, FC1, activation, FC2 (Megatron TP).

FC1 is column-parallel and FC2 row-parallel, so the block needs one collective before
(an all-gather under sequence parallelism) and one after (all-reduce, or reduce-scatter
with sequence parallelism). SwiGLU's FC1 produces a gate and a value, twice the width.
"""

from __future__ import annotations

from mpsim.workload.blocks import (BlockWork, LayerContext, bias_dropout_add, column_backward, grad_gather, linear,
                                   norm, present, tp_collectives)
from mpsim.workload.ops import Item, memory_op


def mlp_items(ctx: LayerContext, name: str, ffn_local: int, tokens: int | None = None
              ) -> tuple[list[Item], list[Item], list[Item], list[Item], float, float, float]:
    """FC1 -> activation -> FC2 of width ``ffn_local`` per rank, with its TP collectives.

    Returns (forward, combined backward, input-gradient, weight-gradient items, params,
    saved bytes, weight-gradient buffer bytes), without the norm and residual around it.
    """
    t, h, e = tokens or ctx.tokens, ctx.hidden, ctx.act_bytes
    fc1_width = ffn_local * (2 if ctx.gated_ffn else 1)
    gather, reduce = tp_collectives(ctx, name)
    fc1, fc1_dgrad, fc1_wgrad = linear(ctx, f"{name}.fc1", t, fc1_width, h)
    fc2, fc2_dgrad, fc2_wgrad = linear(ctx, f"{name}.fc2", t, h, ffn_local)
    act = memory_op(f"{name}.act", t * ffn_local * e * (3 if ctx.gated_ffn else 2))
    act_grad = memory_op(f"{name}.act.grad", t * ffn_local * e * (5 if ctx.gated_ffn else 3))
    fc1_b, fc1_i, fc1_w = column_backward(ctx, f"{name}.fc1", fc1_dgrad, fc1_wgrad, gather)
    head = [*grad_gather(ctx, f"{name}.fc2"), fc2_dgrad]
    forward = [*present(gather), fc1, act, fc2, *present(reduce)]
    backward = [*head, fc2_wgrad, act_grad, *fc1_b]
    backward_input = [*head, act_grad, *fc1_i]
    backward_weight = [fc2_wgrad, *fc1_w]
    params = h * fc1_width + ffn_local * h
    saved = t * fc1_width * e + t * ffn_local * e  # activation input, FC2 input
    wbuf = t * (h + ffn_local) * e + t * (fc1_width + h) * e  # GEMM inputs, output gradients
    return forward, backward, backward_input, backward_weight, float(params), float(saved), float(wbuf)


def mlp_block(ctx: LayerContext, bias: bool, norm_params: int) -> BlockWork:
    """The dense MLP half of a layer on one rank."""
    forward, backward, backward_input, backward_weight, params, saved, wbuf = mlp_items(ctx, "mlp", ctx.ffn_local)
    h, local, e = ctx.hidden, ctx.norm_tokens, ctx.act_bytes
    mask = 1 if ctx.dropout else 0
    fc1_width = ctx.ffn_local * (2 if ctx.gated_ffn else 1)
    params += (fc1_width + h if bias else 0) + norm_params * h
    saved += 2 * local * h * e + local * h * mask  # norm input, FC1 input, dropout mask
    return BlockWork(
        forward=(norm(ctx, "mlp.norm"), *forward, bias_dropout_add(ctx, "mlp.bda")),
        backward=(bias_dropout_add(ctx, "mlp.bda", backward=True), *backward, norm(ctx, "mlp.norm", backward=True)),
        backward_input=(bias_dropout_add(ctx, "mlp.bda", backward=True), *backward_input,
                        norm(ctx, "mlp.norm", backward=True)),
        backward_weight=tuple(backward_weight),
        params=params, saved_bytes=saved, weight_grad_buffer_bytes=wbuf)
