"""Norms: LayerNorm and RMSNorm over a rank's tokens, in one of three kinds of kernel.

A fused norm reads its input once and writes its output once each way; its parameter
gradient is a reduction over the tokens, in a kernel of its own except in Transformer
Engine, whose norm backward computes it in the same pass. No fused norm streams as an
elementwise kernel does (the row reductions), and how near it comes depends on whose
kernel it is (``TrainingOptions.norm_kernel``, resolved per model in ``LayerContext.norm_kernel``):
a hand-written or compiled one (Apex, Transformer Engine, cuDNN, Triton, torch.compile;
"fused") runs at ``FUSED_NORM_BANDWIDTH_SHARE``, the best a published norm kernel reached;
PyTorch's own (nn.LayerNorm, nn.RMSNorm; "pytorch") at ``NATIVE_NORM_BANDWIDTH_SHARE``,
what a published sweep of those very kernels measured. RMSNorm written in PyTorch operators
and run eagerly ("operators") is a kernel per operator, in fp32 (``EAGER_RMSNORM_*``;
``tests/test_eager_norm.py`` holds them to PyTorch's dispatch).
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
# The same with the weight in fp32 and the activations in e (Hugging Face's LlamaRMSNorm on bf16
# input with an fp32 parameter, as Liger-Kernel's benchmark runs it): the weight's product writes
# fp32 (e + 4 where 2e); backward, the fp32 output's gradient is cast up first (e + 4), the
# product's input gradient is fp32 (8) and cast down (4 + e), the weight's gradient reads the fp32
# gradient (product 8 + e, sum 4): 32 + 3e in 8 kernels, 96 + 4e in 16, 12 + e in 2
EAGER_RMSNORM_FP32_WEIGHT_FORWARD = (32, 3, 8)
EAGER_RMSNORM_FP32_WEIGHT_GRAD_INPUT = (96, 4, 16)
EAGER_RMSNORM_FP32_WEIGHT_GRAD_WEIGHT = (12, 1, 2)
# The share of the streaming rate these kernels reach over those bytes, (forward, backward), as
# published: Liger-Kernel's sweep of Hugging Face's LlamaRMSNorm on an A100 (LIGER-BENCH in
# docs/hardware-sources.md), bf16 input of 2,048 rows, at its widest row (32,768) where the
# per-kernel overheads weigh least: the bytes of its fp32-weight form at the part's streaming rate
# over the measured time less those overheads (python benchmarks/memory_kernel_sweep.py prints
# them; tests/test_memory_kernel_sweep.py holds these to it). The elementwise operators alone
# stream (0.95-0.97 for relu and its square on an H100, the same sweep); the mean over each row
# and the per-token kernels between them do not. Taken as the code's on every accelerator; the
# sweep's one check on another part, the same operators after a residual add in fp32 on an H100,
# reached 0.89 and 1.05 there, so these shares price it about a tenth slow.
EAGER_RMSNORM_BANDWIDTH_SHARE = (0.78, 0.92)
# The share of the streaming rate a fused norm kernel reaches over its bytes, (forward, backward):
# the best any fused norm kernel of the published sweeps reached at their largest shapes, the
# rule the GEMMs' best-measured rate follows. cuDNN Frontend's norm benchmark on an H200
# (CUDNN-NORMS in docs/hardware-sources.md; benchmarks/data/cudnn_norms.csv), bf16 RMSNorm over
# 67.1 M elements (16,384 x 4,096, 8,192 x 8,192, 4,096 x 16,384), the bandwidth it prints over
# the bytes each pass must move, against the H200's streaming rate (4,378 GB/s, its BabelStream
# figure): forward best 4,176 GB/s (0.954, torch.compile's Triton kernel at 8,192 x 8,192; cuDNN
# 0.847-0.878), backward best 3,801 GB/s (0.868, cuDNN's one-pass kernel at 16,384 x 4,096;
# torch.compile's two kernels 0.39-0.52). No fused norm measured there or in Liger-Kernel's sweep
# (PyTorch's native LayerNorm and RMSNorm: 0.44-0.68) streams as fast as an elementwise kernel:
# the statistics are a reduction over each row, and the backward's scale gradient a reduction
# over the tokens. Taken as the kernels' on every accelerator (the GB200 rows of the same sweep
# reach 0.906 and 0.873 against its inferred streaming rate), and for every hand-written or
# compiled kernel, Apex's and Transformer Engine's included, which no published sweep times: a
# floor on their cost, not a fit to them (tests/test_norm_sweep.py holds these to the file).
FUSED_NORM_BANDWIDTH_SHARE = (0.954, 0.868)
# The same for PyTorch's native kernels, (forward, backward) by the norm they compute: Liger-Kernel's
# sweep (LIGER-BENCH in docs/hardware-sources.md; benchmarks/data/liger_kernels.csv) of
# torch.nn.LayerNorm in fp32 over 4,096 rows (A100 and H100) and of torch.nn.RMSNorm on bf16 over
# 4,096 tokens (H100), read by the rule above: at the sweep's largest shape (16,384 wide), the best
# part's reading, over the bytes mpsim counts (the input gradient and the parameters' gradient, each
# way at the same share), less the per-kernel overheads. LayerNorm forward 0.617 (A100; the H100
# 0.565), backward 0.675 (H100); RMSNorm 0.585 and 0.439 (python benchmarks/memory_kernel_sweep.py
# prints them; tests/test_memory_kernel_sweep.py holds these to it), below the fused kernels' best
# both ways. Taken as the kernels' on every accelerator, as the shares above.
NATIVE_NORM_BANDWIDTH_SHARE = {"layernorm": (0.617, 0.675), "rmsnorm": (0.585, 0.439)}


def norm_bandwidth_share(kernel: str, kind: str) -> tuple[float, float]:
    """(forward, backward) share of the streaming rate of a ``kind`` norm ("layernorm", "rmsnorm") in
    ``kernel`` ("pytorch": PyTorch's native kernel; "fused": a hand-written or compiled one)."""
    if kernel == "pytorch":
        return NATIVE_NORM_BANDWIDTH_SHARE[kind]
    if kernel == "fused":
        return FUSED_NORM_BANDWIDTH_SHARE
    raise ValueError(f"{kernel!r} is not a one-kernel norm (the operators' shares are EAGER_RMSNORM_*)")


def _eager_bytes(part: tuple[int, int, int], elements: float, act_bytes: int) -> tuple[float, int]:
    fixed, per_act_byte, kernels = part
    return elements * (fixed + per_act_byte * act_bytes), kernels


def eager_rmsnorm_ops(name: str, elements: float, act_bytes: int, fp32_weight: bool = False
                      ) -> tuple[Op, Op, Op]:
    """The eager RMSNorm over ``elements`` activations: (forward, input gradient, weight gradient),
    with its weight in the activations' dtype or, with ``fp32_weight``, in fp32."""
    parts = (EAGER_RMSNORM_FP32_WEIGHT_FORWARD, EAGER_RMSNORM_FP32_WEIGHT_GRAD_INPUT,
             EAGER_RMSNORM_FP32_WEIGHT_GRAD_WEIGHT) if fp32_weight else \
        (EAGER_RMSNORM_FORWARD, EAGER_RMSNORM_GRAD_INPUT, EAGER_RMSNORM_GRAD_WEIGHT)
    forward_share, backward_share = EAGER_RMSNORM_BANDWIDTH_SHARE
    ops = []
    for suffix, part, share in zip(("", ".grad", ".grad_params"), parts,
                                   (forward_share, backward_share, backward_share)):
        moved, kernels = _eager_bytes(part, elements, act_bytes)
        ops.append(memory_op(f"{name}{suffix}", moved, launches=kernels, bandwidth_share=share))
    return ops[0], ops[1], ops[2]


def norm_passes(name: str, elements: float, act_bytes: int, layers_impl: str, kernel: str, kind: str
                ) -> tuple[Op, list[Op], list[Op]]:
    """A ``kind`` norm over ``elements`` activations in ``kernel`` ("operators", "pytorch", "fused"):
    (forward, input-gradient ops, parameter-gradient ops), as :func:`norm_grad` splits them."""
    if kernel == "operators":
        # autograd runs the weight's gradient beside the input's, in the same backward
        forward, grad_input, grad_weight = eager_rmsnorm_ops(name, elements, act_bytes)
        return forward, [grad_input], [grad_weight]
    grad_input, grad_params = norm_grad_ops(name, elements, act_bytes, layers_impl, kernel, kind)
    return fused_norm_op(name, elements, act_bytes, kernel, kind), grad_input, grad_params


def norm_saved_extra(kernel: str) -> int:
    """Bytes per element a norm in ``kernel`` keeps for its backward beyond its input (the eager
    RMSNorm's fp32 copy)."""
    return EAGER_RMSNORM_SAVED_EXTRA if kernel == "operators" else 0


def _ctx_passes(ctx: LayerContext, name: str) -> tuple[Op, list[Op], list[Op]]:
    return norm_passes(name, ctx.norm_tokens * ctx.hidden, ctx.act_bytes, ctx.layers_impl, ctx.norm_kernel,
                       ctx.norm_kind)


def norm(ctx: LayerContext, name: str) -> Op:
    """LayerNorm / RMSNorm over the rank's tokens (its backward: :func:`norm_grad`)."""
    return _ctx_passes(ctx, name)[0]


def fused_norm_op(name: str, elements: float, act_bytes: int, kernel: str = "fused", kind: str = "layernorm") -> Op:
    """A one-kernel norm's forward over ``elements`` activations: read the input, write the output."""
    return memory_op(name, elements * act_bytes * 2, bandwidth_share=norm_bandwidth_share(kernel, kind)[0])


def norm_saved_bytes(ctx: LayerContext) -> float:
    """Bytes a norm keeps for its backward beyond its input (:func:`norm_saved_extra`)."""
    return float(ctx.norm_tokens * ctx.hidden * norm_saved_extra(ctx.norm_kernel))


def norm_grad(ctx: LayerContext, name: str) -> tuple[list[Op], list[Op]]:
    """A norm's backward: (input-gradient ops, parameter-gradient ops).

    The input gradient reads the input and the output gradient and writes the input's
    gradient. The scale's (and shift's) gradient is a reduction over the tokens of the same
    two tensors: Transformer Engine's norm backward computes it in the same pass; Apex's
    fused norm (Megatron's local layers) and PyTorch's ``native_layer_norm_backward`` run
    it as a kernel of its own, which a split backward of plain PyTorch
    (``torch.distributed.pipelining``'s weight pass) runs with the weights.
    """
    _, grad_input, grad_params = _ctx_passes(ctx, name)
    return grad_input, grad_params


def norm_grad_ops(name: str, elements: float, act_bytes: int, layers_impl: str, kernel: str = "fused",
                  kind: str = "layernorm") -> tuple[list[Op], list[Op]]:
    """:func:`norm_grad` of a one-kernel norm over ``elements`` activations of ``act_bytes`` each."""
    share = norm_bandwidth_share(kernel, kind)[1]
    grad_input = [memory_op(f"{name}.grad", elements * act_bytes * 3, bandwidth_share=share)]
    if layers_impl == "transformer_engine":
        return grad_input, []
    grad_params = [memory_op(f"{name}.grad_params", elements * act_bytes * 2, bandwidth_share=share)]
    if layers_impl == "pytorch":
        return grad_input, grad_params
    return grad_input + grad_params, []
