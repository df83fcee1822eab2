"""A transformer model written out as a layer stack, layer by layer.

This is the generic description of what ``TransformerSpec`` means (Megatron-LM's GPT
layer): an embedding (tokens plus learned positions), ``num_layers`` blocks of norm,
self-attention, bias-dropout-add, norm, column-parallel FC1, activation, row-parallel
FC2, bias-dropout-add, and a head of final norm, (tied) output projection and cross
entropy. Simulating the stack gives the transformer model's step time, which is how the
stack's layer kinds are checked against the transformer path (tests/test_layer_stack.py).
Dense MHA/GQA models only: MoE and latent attention have no stack layer kind.
"""

from __future__ import annotations

from typing import Any

from mpsim.specs.model import TransformerSpec
from mpsim.specs.stack import LayerStackSpec
from mpsim.workload.embedding import padded_vocab


def transformer_stack_dict(model: TransformerSpec, tp: int = 1) -> dict[str, Any]:
    """The layer-stack mapping (as a model file would hold it) of a dense transformer."""
    if model.moe is not None or model.mla is not None:
        raise ValueError(f"{model.name}: mixture-of-experts and latent attention have no layer-stack form")
    norm = {"kind": model.norm}
    p, bias = model.dropout, model.linear_bias
    vocab = padded_vocab(model.vocab_size, tp)
    ffn_width = model.ffn_hidden_size * (2 if model.gated_ffn else 1)
    block = [
        {**norm, "name": "attn_norm"},
        {"kind": "attention", "name": "attention", "num_heads": model.num_attention_heads,
         "num_kv_heads": model.kv_heads, "head_dim": model.dim_per_head, "causal": True, "bias": bias,
         "rope": model.position_embedding == "rope", "dropout": p},
        {"kind": "elementwise", "name": "attn_residual", "op": "bias_dropout_add", "dropout": p},
        {**norm, "name": "mlp_norm"},
        {"kind": "linear", "name": "fc1", "out_features": ffn_width, "bias": bias, "tp": "column"},
        {"kind": "elementwise", "name": "activation", "op": "swiglu" if model.gated_ffn else "gelu"},
        {"kind": "linear", "name": "fc2", "out_features": model.hidden_size, "bias": bias, "tp": "row"},
        {"kind": "elementwise", "name": "mlp_residual", "op": "bias_dropout_add", "dropout": p},
    ]
    head = [
        {**norm, "name": "final_norm"},
        {"kind": "linear", "name": "logits", "out_features": vocab, "bias": False, "tp": "column",
         **({"tie": "embedding"} if model.tied_embeddings else {})},
        {"kind": "cross_entropy", "name": "loss"},
    ]
    return {
        "kind": "stack",
        "name": f"{model.name} (layer stack)",
        "description": f"{model.name} written out layer by layer",
        "input_shape": [model.seq_length],
        "tokens_per_sample": model.seq_length,
        "layers": [
            {"kind": "embedding", "name": "embedding", "num_embeddings": vocab, "embedding_dim": model.hidden_size,
             "positions": model.seq_length if model.position_embedding == "learned" else 0, "dropout": p},
            {"kind": "block", "name": "layer", "repeat": model.num_layers, "layers": block},
            {"kind": "block", "name": "head", "repeat": 1, "layers": head},
        ],
    }


def transformer_as_stack(model: TransformerSpec, tp: int = 1) -> LayerStackSpec:
    """The layer stack of a dense transformer (vocabulary padded for ``tp`` as Megatron does)."""
    return LayerStackSpec.model_validate(transformer_stack_dict(model, tp))


def stack_layers_per_stage(layers_per_chunk: tuple[int, ...] | list[int]) -> list[int]:
    """The stack's units per chunk for a transformer split: the embedding joins the first chunk, the head the last."""
    units = list(layers_per_chunk)
    units[0] += 1
    units[-1] += 1
    return units
