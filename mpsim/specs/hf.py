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
    if key not in config:
        raise InputError(f"Hugging Face config has no {key!r}", label)
    return config[key]


def from_hf_config(config: dict, name: str, label: str) -> dict[str, Any]:
    """A TransformerSpec tree (plain dict) from a Hugging Face config."""
    kind = config["model_type"]
    if kind not in SUPPORTED:
        raise InputError(f"model_type {kind!r} is not supported; supported: {', '.join(SUPPORTED)}", label)
    heads = _require(config, "num_attention_heads", label)
    hidden = _require(config, "hidden_size", label)
    act = config.get("hidden_act", DEFAULT_ACTIVATION.get(kind, "silu"))
    if act not in FFN_TYPES:
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
        "dropout": float(config.get("attention_dropout", 0.0) or 0.0),
    }
    kv_heads = config.get("num_key_value_heads")
    if kv_heads and kv_heads != heads:
        tree["num_query_groups"] = kv_heads
    if config.get("head_dim") and config["head_dim"] != hidden // heads:
        tree["head_dim"] = config["head_dim"]
    if kind in ("mixtral",):
        tree["moe"] = {"num_experts": config["num_local_experts"], "top_k": config["num_experts_per_tok"],
                       "expert_ffn_hidden_size": config["intermediate_size"]}
    elif kind in ("qwen2_moe", "qwen3_moe"):
        tree["moe"] = {"num_experts": config["num_experts"], "top_k": config["num_experts_per_tok"],
                       "expert_ffn_hidden_size": config["moe_intermediate_size"]}
        shared = config.get("shared_expert_intermediate_size")
        if shared:
            tree["moe"].update({"shared_experts": 1, "shared_expert_ffn_hidden_size": shared})
    elif kind in ("deepseek_v3", "deepseek_v2"):
        tree["moe"] = {"num_experts": config["n_routed_experts"], "top_k": config["num_experts_per_tok"],
                       "expert_ffn_hidden_size": config["moe_intermediate_size"],
                       "shared_experts": config.get("n_shared_experts", 0) or 0,
                       "dense_layers": config.get("first_k_dense_replace", 0)}
        tree["mla"] = {"q_lora_rank": config.get("q_lora_rank"), "kv_lora_rank": config["kv_lora_rank"],
                       "qk_nope_head_dim": config["qk_nope_head_dim"], "qk_rope_head_dim": config["qk_rope_head_dim"],
                       "v_head_dim": config["v_head_dim"]}
        tree.pop("num_query_groups", None)
    return tree
