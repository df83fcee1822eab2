"""Norms: LayerNorm and RMSNorm over a rank's tokens, fused or as PyTorch's operators.

A fused norm (Apex's, Transformer Engine's, a Triton kernel, PyTorch's native LayerNorm)
reads its input once and writes its output once each way; its parameter gradient is a
reduction over the tokens, in a kernel of its own except in Transformer Engine, whose
norm backward computes it in the same pass. RMSNorm written in PyTorch operators and run
eagerly (``LayerContext.eager_rmsnorm``, ``training.fused_norm``) is a kernel per operator,
in fp32 (``EAGER_RMSNORM_*``; ``tests/test_eager_norm.py`` holds them to PyTorch's dispatch).
"""

from __future__ import annotations

from mpsim.workload.blocks import LayerContext
from mpsim.workload.ops import Op, memory_op

# RMSNorm in PyTorch operators, y = (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w
# (torchtitan's RMSNorm, torchtitan/models/norms.py; Hugging Face's LlamaRMSNorm), run eagerly:
# (bytes per element of the normalized tensor, fixed part, per byte of the activation e; kernels),
# as PyTorch dispatches them (tests/test_eager_norm.py counts them). Forward: the cast to fp32
# (e + 4), the square (8), the mean (4), eps and rsqrt on one number per token, the scale (8), the
# cast back (4 + e), the weight (2e): 28 + 4e in 8 kernels. Backward, input side: the weight's
# product (2e), the cast (e + 4), the scale's two gradients (8 + 12, and 4 for the sum over the
# hidden), three kernels on one number per token, the mean's backward (8), the square's (8, 8, 12),
# the two paths summed into the fp32 input (12), the cast back (4 + e): 80 + 4e in 14 kernels;
# the weight's gradient, a product and a sum over the tokens, 4e in 2. Kept for the backward: the
# fp32 input (4, which the square and the scale share) and the cast output (e) for the weight,
# where a fused norm keeps its input (e): 4 bytes per element more.
EAGER_RMSNORM_FORWARD = (28, 4, 8)
EAGER_RMSNORM_GRAD_INPUT = (80, 4, 14)
EAGER_RMSNORM_GRAD_WEIGHT = (0, 4, 2)
EAGER_RMSNORM_SAVED_EXTRA = 4


def _eager_bytes(part: tuple[int, int, int], elements: float, act_bytes: int) -> tuple[float, int]:
    fixed, per_act_byte, kernels = part
    return elements * (fixed + per_act_byte * act_bytes), kernels


def eager_rmsnorm_ops(name: str, elements: float, act_bytes: int) -> tuple[Op, Op, Op]:
    """The eager RMSNorm over ``elements`` activations: (forward, input gradient, weight gradient)."""
    ops = []
    for suffix, part in (("", EAGER_RMSNORM_FORWARD), (".grad", EAGER_RMSNORM_GRAD_INPUT),
                         (".grad_params", EAGER_RMSNORM_GRAD_WEIGHT)):
        moved, kernels = _eager_bytes(part, elements, act_bytes)
        ops.append(memory_op(f"{name}{suffix}", moved, launches=kernels))
    return ops[0], ops[1], ops[2]


def norm(ctx: LayerContext, name: str) -> Op:
    """LayerNorm / RMSNorm over the rank's tokens (its backward: :func:`norm_grad`)."""
    elems = ctx.norm_tokens * ctx.hidden
    if ctx.eager_rmsnorm:
        return eager_rmsnorm_ops(name, elems, ctx.act_bytes)[0]
    return memory_op(name, elems * ctx.act_bytes * 2)


def norm_saved_bytes(ctx: LayerContext) -> float:
    """Bytes a norm keeps for its backward beyond its input (the eager RMSNorm's fp32 copy)."""
    return ctx.norm_tokens * ctx.hidden * EAGER_RMSNORM_SAVED_EXTRA if ctx.eager_rmsnorm else 0.0


def norm_grad(ctx: LayerContext, name: str) -> tuple[list[Op], list[Op]]:
    """A norm's backward: (input-gradient ops, parameter-gradient ops).

    The input gradient reads the input and the output gradient and writes the input's
    gradient. The scale's (and shift's) gradient is a reduction over the tokens of the same
    two tensors: Transformer Engine's norm backward computes it in the same pass; Apex's
    fused norm (Megatron's local layers) and PyTorch's ``native_layer_norm_backward`` run
    it as a kernel of its own, which a split backward of plain PyTorch
    (``torch.distributed.pipelining``'s weight pass) runs with the weights.
    """
    elements = ctx.norm_tokens * ctx.hidden
    if ctx.eager_rmsnorm:
        # autograd runs the weight's gradient beside the input's, in the same backward
        _, grad_input, grad_weight = eager_rmsnorm_ops(name, elements, ctx.act_bytes)
        return [grad_input], [grad_weight]
    return norm_grad_ops(name, elements, ctx.act_bytes, ctx.layers_impl)


def norm_grad_ops(name: str, elements: float, act_bytes: int, layers_impl: str) -> tuple[list[Op], list[Op]]:
    """:func:`norm_grad` over ``elements`` activations of ``act_bytes`` each."""
    grad_input = [memory_op(f"{name}.grad", elements * act_bytes * 3)]
    if layers_impl == "transformer_engine":
        return grad_input, []
    grad_params = [memory_op(f"{name}.grad_params", elements * act_bytes * 2)]
    if layers_impl == "pytorch":
        return grad_input, grad_params
    return grad_input + grad_params, []
