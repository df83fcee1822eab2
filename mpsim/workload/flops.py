"""Model FLOPs, the numerator of MFU, in the convention the papers use.

Model FLOPs count the GEMMs of forward and backward (3x the forward) with the full,
unmasked attention score matrix and no recompute (Korthikanti et al. 2022, eq. 7;
NVIDIA NeMo's formula for GQA/SwiGLU models). For a GPT model with a 4h GeLU FFN this is
``72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L))``. Hardware FLOPs (for HFU) are what the
simulated ranks actually executed, recompute included, summed from the ops.
"""

from __future__ import annotations

from mpsim.specs.model import TransformerSpec


def model_flops_per_sequence(model: TransformerSpec) -> float:
    """Training FLOPs (forward + backward, no recompute) for one sequence."""
    h, s, d = model.hidden_size, model.seq_length, model.dim_per_head
    a, g = model.num_attention_heads, model.kv_heads
    qkv = 2 * h * (a + 2 * g) * d
    proj = 2 * a * d * h
    ffn = 2 * h * model.ffn_hidden_size * (3 if model.gated_ffn else 2)
    attention = 4 * s * a * d
    per_token_forward = model.num_layers * (qkv + proj + ffn + attention) + 2 * h * model.vocab_size
    return 3.0 * s * per_token_forward
