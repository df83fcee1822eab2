"""Model FLOPs, the numerator of MFU, in the convention the papers use.

Model FLOPs count the GEMMs of forward and backward (3x the forward) with the full,
unmasked attention score matrix and no recompute (Korthikanti et al. 2022, eq. 7;
NVIDIA NeMo's formula for GQA/SwiGLU models). For a GPT model with a 4h GeLU FFN this is
``72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L))``. Mixture-of-experts layers count the router,
the top-k routed experts and the shared experts a token goes through (active
parameters). A dense FFN is its GEMMs: three of ``h x ffn`` when gated (SwiGLU), two
otherwise (GeLU, squared ReLU, ReLU); the activation between them is not counted, as
PyTorch's FLOP counter does not count it. Hardware FLOPs (for HFU) are what the simulated ranks actually executed,
recompute included, summed from the ops.
"""

from __future__ import annotations

from mpsim.specs.model import TransformerSpec
from mpsim.workload.mlp import FFN_ACTIVATIONS


def _attention_flops_per_token(model: TransformerSpec) -> float:
    """Forward FLOPs per token of one layer's attention projections and core."""
    h, s, a = model.hidden_size, model.seq_length, model.num_attention_heads
    mla = model.mla
    if mla is None:
        d, g = model.dim_per_head, model.kv_heads
        projections = 2 * h * (a + 2 * g) * d + 2 * a * d * h
        d_qk = d_v = d
    else:
        d_qk, d_v = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
        q_in = mla.q_lora_rank or h
        down = (mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim
        projections = 2 * (h * down + q_in * a * d_qk + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + d_v)
                           + a * d_v * h)
    return projections + 2 * s * a * (d_qk + d_v)


def _ffn_flops_per_token(model: TransformerSpec, dense: bool) -> float:
    """Forward FLOPs per token of one layer's dense MLP or MoE block."""
    # FC1's up projections (two when gated) and FC2
    h, mult = model.hidden_size, FFN_ACTIVATIONS[model.ffn_activation].up_projections + 1
    if dense or model.moe is None:
        return 2 * h * model.ffn_hidden_size * mult
    moe = model.moe
    return 2 * h * moe.num_experts + 2 * h * (moe.top_k * moe.expert_ffn_hidden_size + moe.shared_ffn) * mult


def model_flops_per_sequence(model: TransformerSpec) -> float:
    """Training FLOPs (forward + backward, no recompute) for one sequence (one sample of a layer stack)."""
    if model.kind == "stack":
        from mpsim.workload.layer_stack import stack_model_flops_per_sample

        return stack_model_flops_per_sample(model)  # type: ignore[arg-type]
    dense_layers = model.moe.dense_layers if model.moe else model.num_layers
    attention = model.num_layers * _attention_flops_per_token(model)
    ffn = (dense_layers * _ffn_flops_per_token(model, True)
           + (model.num_layers - dense_layers) * _ffn_flops_per_token(model, False))
    per_token_forward = attention + ffn + 2 * model.hidden_size * model.vocab_size
    return 3.0 * model.seq_length * per_token_forward
