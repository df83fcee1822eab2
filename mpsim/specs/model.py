"""A decoder-only transformer: the shapes that decide its cost and memory.

Field names follow Megatron-LM's arguments (``num_layers``, ``hidden_size``,
``ffn_hidden_size``, ``num_attention_heads``, ``num_query_groups`` for GQA), so a
Megatron or NeMo config maps across line by line.

A model file is a transformer unless it says ``kind: stack`` (any ordered stack of
layers, ``mpsim/specs/stack.py``); :func:`parse_model` picks the class by that field.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, model_validator

from mpsim.specs.base import Spec
from mpsim.specs.stack import LayerStackSpec, input_error


class MoESpec(Spec):
    """Mixture-of-experts feed-forward layers (Mixtral, DeepSeek-V3, Grok)."""

    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0, description="experts each token is routed to")
    expert_ffn_hidden_size: int = Field(gt=0)
    shared_experts: int = Field(0, ge=0, description="experts every token goes through (DeepSeek)")
    shared_expert_ffn_hidden_size: int | None = Field(None, gt=0, description="default: expert_ffn_hidden_size")
    capacity_factor: float | None = Field(
        None, gt=0, description="tokens an expert takes, relative to an even share; extra tokens are dropped")
    load_imbalance: float = Field(
        1.0, ge=1.0, description="tokens of the busiest expert-parallel rank over the mean (1.0 = perfectly even)")
    dense_layers: int = Field(0, ge=0, description="leading layers with a dense FFN instead (DeepSeek-V3: 3)")
    # Group-limited routing (DeepSeek-V2/V3; Megatron-Core's --moe-router-num-groups and
    # --moe-router-group-topk): the experts form equal groups, each token first picks the
    # router_group_topk groups whose best top_k / router_group_topk experts score highest, then
    # its top_k experts among theirs. With one group per node a token reaches at most that many
    # nodes, which a deduplicating dispatcher (training.moe_token_dispatcher: deepep) turns into
    # less network traffic; the plain all-to-all sends one copy per expert either way
    router_groups: int | None = Field(
        None, gt=0, description="groups the experts form for group-limited routing (DeepSeek-V3: 8, one per node)")
    router_group_topk: int | None = Field(
        None, gt=0, description="groups each token picks its experts from (DeepSeek-V3: 4)")

    @model_validator(mode="after")
    def _routing(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} is larger than num_experts={self.num_experts}")
        if (self.router_groups is None) != (self.router_group_topk is None):
            raise ValueError("router_groups and router_group_topk go together: set both for group-limited "
                             "routing, or neither")
        if self.router_groups is not None and self.router_group_topk is not None:
            groups, picked = self.router_groups, self.router_group_topk
            if self.num_experts % groups:
                raise ValueError(f"router_groups={groups} does not divide num_experts={self.num_experts}")
            if picked > groups:
                raise ValueError(f"router_group_topk={picked} is larger than router_groups={groups}")
            if self.top_k > picked * (self.num_experts // groups):
                raise ValueError(f"top_k={self.top_k} is more than the {picked * (self.num_experts // groups)} "
                                 f"experts of {picked} groups of {self.num_experts // groups}")
        return self

    @property
    def shared_ffn(self) -> int:
        """Total FFN width of the shared experts."""
        return self.shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size)


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed queries, keys and values."""

    q_lora_rank: int | None = Field(None, gt=0, description="query compression rank; None: a full query projection")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)


class TransformerSpec(Spec):
    """Decoder-only transformer (GPT, Llama, Mixtral, DeepSeek, ...)."""

    # the default model kind; left out of dumps so configs saved before stacks existed stay equal
    kind: Literal["transformer"] = Field("transformer", exclude=True)
    name: str
    description: str = ""
    # no trained model has had more than a few hundred layers; a typo like 40000000 would
    # build that many layers' work before any message
    num_layers: int = Field(gt=0, le=100_000)
    # the sizes below are bounded far above any model built (hidden 2^18, a 16M-token context,
    # a 16M-word vocabulary) so that a slip of the keyboard is an error, not a 10^15 s step
    hidden_size: int = Field(gt=0, le=1 << 18)
    ffn_hidden_size: int = Field(gt=0, le=1 << 20)
    ffn_type: Literal["gelu", "swiglu", "squared_relu", "relu"] = Field(
        "gelu", description="the FFN's activation: gelu (GPT), swiglu (gated: Llama, Mixtral), squared_relu "
                            "(Nemotron-4, Hugging Face's relu2), relu (OPT); only swiglu has a gated, two-part FC1")
    num_attention_heads: int = Field(gt=0, le=1 << 16)
    num_query_groups: int | None = Field(None, gt=0, description="KV heads (GQA); default: one per head")
    head_dim: int | None = Field(None, gt=0, description="default: hidden_size / num_attention_heads")
    vocab_size: int = Field(gt=0, le=1 << 24)
    seq_length: int = Field(gt=0, le=1 << 24)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rope"] = "learned"
    tied_embeddings: bool = False
    linear_bias: bool = True
    dropout: float = Field(0.0, ge=0, lt=1, description="hidden and attention dropout probability")
    moe: MoESpec | None = Field(None, description="mixture-of-experts FFN; dense FFN when absent")
    mla: MLASpec | None = Field(None, description="multi-head latent attention instead of MHA/GQA projections")

    @model_validator(mode="after")
    def _shapes(self) -> "TransformerSpec":
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; set head_dim explicitly"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_query_groups {self.kv_heads}"
            )
        if self.moe is not None and self.moe.dense_layers > self.num_layers:
            raise ValueError(f"moe.dense_layers={self.moe.dense_layers} exceeds num_layers={self.num_layers}")
        return self

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (equal to the heads without GQA)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        """Size of one attention head."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def gated_ffn(self) -> bool:
        """True when the MLP's first projection produces a gate and a value (SwiGLU)."""
        return self.ffn_type == "swiglu"

    @property
    def ffn_activation(self) -> str:
        """The FFN's activation (``ffn_type``): gelu, swiglu, squared_relu or relu."""
        return self.ffn_type


ModelSpec = Union[TransformerSpec, LayerStackSpec]
MODEL_KINDS: dict[str, type[TransformerSpec] | type[LayerStackSpec]] = {
    "transformer": TransformerSpec, "stack": LayerStackSpec}


def parse_model(value: Any) -> ModelSpec:
    """A model from its mapping: a transformer unless ``kind`` says otherwise.

    Validating the chosen class directly (not the union) keeps every error's location
    the field's own path, e.g. ``model.layers.3.out_features``.
    """
    if isinstance(value, (TransformerSpec, LayerStackSpec)):
        return value
    kind = value.get("kind", "transformer") if isinstance(value, dict) else "transformer"
    cls = MODEL_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise input_error(("kind",), f"unknown model kind {kind!r}; use transformer (the default) or stack "
                                     f"(for a PyTorch model, write a stack with mpsim import-torch)", kind)
    return cls.model_validate(value)


__all__ = ["LayerStackSpec", "MLASpec", "MODEL_KINDS", "ModelSpec", "MoESpec", "TransformerSpec",
           "parse_model"]
