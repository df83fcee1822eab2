"""Model files from Hugging Face ``config.json`` (Llama, Mistral/Mixtral, Qwen2/Qwen2-MoE, DeepSeek-V3, Nemotron).

A scenario's ``model:`` may point at a ``config.json`` (or ``hf:PATH``); its fields are
mapped onto :class:`~mpsim.specs.model.TransformerSpec` names. The training sequence
length is not in a config (``max_position_embeddings`` is the longest the model
supports), so it is taken from there unless the scenario overrides ``model.seq_length``.
"""

from __future__ import annotations

from typing import Any

from mpsim.errors import InputError

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v3", "deepseek_v2",
             "nemotron")
# transformers' ACT2FN names (activations.py) -> ffn_type. The decoder models above gate their FFN
# with silu (SwiGLU); Nemotron's "relu2" is squared ReLU (NemotronConfig's default hidden_act)
FFN_TYPES = {"silu": "swiglu", "swish": "swiglu", "swiglu": "swiglu", "relu2": "squared_relu", "relu": "relu",
             "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu", "gelu_pytorch_tanh": "gelu",
             "gelu_python": "gelu", "quick_gelu": "gelu"}
DEFAULT_ACTIVATION = {"nemotron": "relu2"}


def looks_like_hf(data: Any) -> bool:
    """True for a Hugging Face model config (it names its model type)."""
    return isinstance(data, dict) and "model_type" in data


def _require(config: dict, key: str, label: str) -> Any:
    """A positive whole number the config must have (sizes and counts)."""
    if key not in config:
        raise InputError(f"Hugging Face config has no {key!r}", label)
    return _count(config, key, label)


def _count(config: dict, key: str, label: str, least: int = 1) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"expected a whole number, got {value!r}", label, key)
    if value < least:
        raise InputError(f"must be {least} or more, got {value}", label, key)
    return value


def _optional(config: dict, key: str, label: str, least: int = 1) -> int | None:
    """A whole number the config may leave out (or set to null)."""
    return None if config.get(key) is None else _count(config, key, label, least)


def from_hf_config(config: dict, name: str, label: str) -> dict[str, Any]:
    """A TransformerSpec tree (plain dict) from a Hugging Face config."""
    kind = config["model_type"]
    if not isinstance(kind, str) or kind not in SUPPORTED:
        raise InputError(f"model_type {kind!r} is not supported; supported: {', '.join(SUPPORTED)}", label)
    heads = _require(config, "num_attention_heads", label)
    hidden = _require(config, "hidden_size", label)
    act = config.get("hidden_act", DEFAULT_ACTIVATION.get(kind, "silu"))
    if not isinstance(act, str) or act not in FFN_TYPES:
        raise InputError(f"{act!r} is not a known FFN activation; known: {', '.join(FFN_TYPES)}",
                         label, "hidden_act")
    tree: dict[str, Any] = {
        "name": name,
        "description": f"from a Hugging Face config ({kind})",
        "num_layers": _require(config, "num_hidden_layers", label),
        "hidden_size": hidden,
        "ffn_hidden_size": _require(config, "intermediate_size", label),
        "ffn_type": FFN_TYPES[act],
        "num_attention_heads": heads,
        "vocab_size": _require(config, "vocab_size", label),
        "seq_length": _require(config, "max_position_embeddings", label),
        # Nemotron names its epsilon norm_eps: LayerNorm ("layernorm1p"), not RMSNorm
        "norm": "rmsnorm" if "rms_norm_eps" in config else "layernorm",
        "position_embedding": "rope",
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        # Qwen2 has biases on the QKV projection only; they are too small to matter
        "linear_bias": bool(config.get("mlp_bias", False)),
        "dropout": config.get("attention_dropout", 0.0) or 0.0,
    }
    kv_heads = _optional(config, "num_key_value_heads", label)
    if kv_heads is not None and kv_heads != heads:
        tree["num_query_groups"] = kv_heads
    head_dim = _optional(config, "head_dim", label)
    if head_dim is not None and head_dim != hidden // heads:
        tree["head_dim"] = head_dim
    if kind in ("mixtral",):
        tree["moe"] = {"num_experts": _require(config, "num_local_experts", label),
                       "top_k": _require(config, "num_experts_per_tok", label),
                       "expert_ffn_hidden_size": _require(config, "intermediate_size", label)}
    elif kind in ("qwen2_moe", "qwen3_moe"):
        tree["moe"] = {"num_experts": _require(config, "num_experts", label),
                       "top_k": _require(config, "num_experts_per_tok", label),
                       "expert_ffn_hidden_size": _require(config, "moe_intermediate_size", label)}
        shared = _optional(config, "shared_expert_intermediate_size", label, least=0)
        if shared:
            tree["moe"].update({"shared_experts": 1, "shared_expert_ffn_hidden_size": shared})
    elif kind in ("deepseek_v3", "deepseek_v2"):
        tree["moe"] = {"num_experts": _require(config, "n_routed_experts", label),
                       "top_k": _require(config, "num_experts_per_tok", label),
                       "expert_ffn_hidden_size": _require(config, "moe_intermediate_size", label),
                       "shared_experts": _optional(config, "n_shared_experts", label, least=0) or 0,
                       "dense_layers": _optional(config, "first_k_dense_replace", label, least=0) or 0}
        # group-limited routing: n_group expert groups, each token's experts from topk_group of them
        groups = _optional(config, "n_group", label)
        if groups is not None and groups > 1:
            tree["moe"].update({"router_groups": groups, "router_group_topk": _require(config, "topk_group", label)})
        tree["mla"] = {"q_lora_rank": _optional(config, "q_lora_rank", label),
                       "kv_lora_rank": _require(config, "kv_lora_rank", label),
                       "qk_nope_head_dim": _require(config, "qk_nope_head_dim", label),
                       "qk_rope_head_dim": _require(config, "qk_rope_head_dim", label),
                       "v_head_dim": _require(config, "v_head_dim", label)}
        tree.pop("num_query_groups", None)
    return tree
