"""Memory per rank: model state (weights, gradients, optimizer) and activations.

Activations follow the tensors each op saves for its backward pass, which for a GPT
layer with GeLU, full multi-head attention and dropout gives exactly Korthikanti et al.
2022, Table 2: ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes with TP, ``34*s*b*h/t`` with
TP + SP + selective recompute, ``2*s*b*h`` (``/t`` with SP) with full recompute. The same
accounting extends to SwiGLU, GQA and fused attention, which save other tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.workload.transformer import LayerContext


def layer_activation_bytes(ctx: LayerContext, recompute: str) -> float:
    """Bytes one layer keeps from its forward pass until its backward pass, per microbatch."""
    e = ctx.act_bytes
    tokens, local, h = ctx.tokens, ctx.norm_tokens, ctx.hidden
    if recompute == "full":
        return float(local * h * e)  # only the layer input is kept
    mask = 1 if ctx.dropout else 0
    qkv = tokens * ctx.qkv_local * e
    context = tokens * ctx.heads_local * ctx.head_dim * e
    core = 0.0
    if recompute != "selective":
        if ctx.flash_attention:
            core = ctx.microbatch_size * ctx.heads_local * ctx.seq_length * 4  # softmax log-sum-exp
        else:
            scores = ctx.microbatch_size * ctx.heads_local * ctx.seq_length ** 2
            core = scores * (e + (mask + e if ctx.dropout else 0))  # probs (+ dropout mask and output)
    attention = 2 * local * h * e + qkv + core + context + local * h * mask  # norm in, qkv in, ..., mask
    ffn_in = tokens * ctx.fc1_local * e
    ffn_out = tokens * ctx.ffn_local * e
    mlp = 2 * local * h * e + ffn_in + ffn_out + local * h * mask  # norm in, fc1 in, act in, fc2 in, mask
    return float(attention + mlp)


def layer_weight_grad_buffer_bytes(ctx: LayerContext) -> float:
    """Bytes a split backward keeps from ``I`` until ``W``: GEMM inputs and output gradients."""
    e, tokens, h = ctx.act_bytes, ctx.tokens, ctx.hidden
    inputs = tokens * (h + ctx.heads_local * ctx.head_dim + h + ctx.ffn_local) * e
    output_grads = tokens * (ctx.qkv_local + h + ctx.fc1_local + h) * e
    return float(inputs + output_grads)


def embedding_activation_bytes(ctx: LayerContext) -> float:
    """The embedding keeps only its dropout mask."""
    return float(ctx.norm_tokens * ctx.hidden) if ctx.dropout else 0.0


def head_activation_bytes(ctx: LayerContext, vocab_local: int) -> float:
    """Final norm input, LM-head input and the fp32 softmax the cross entropy keeps."""
    e = ctx.act_bytes
    return float(ctx.norm_tokens * ctx.hidden * e + ctx.tokens * ctx.hidden * e + ctx.tokens * vocab_local * 4)


@dataclass(frozen=True)
class ModelStateBytes:
    """Weights, gradients and optimizer state of the parameters one rank holds."""

    params: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(params: float, *, weight_bytes: int = 2, grad_bytes: int = 4, dp: int = 1,
                      distributed_optimizer: bool = False) -> ModelStateBytes:
    """Mixed-precision Adam: bf16 weights, fp32 (or bf16) gradients, fp32 master + m + v."""
    optimizer = params * 12 / (dp if distributed_optimizer else 1)
    return ModelStateBytes(params, params * weight_bytes, params * grad_bytes, optimizer)
