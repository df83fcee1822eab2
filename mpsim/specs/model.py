"""A decoder-only transformer: the shapes that decide its cost and memory.

Field names follow Megatron-LM's arguments (``num_layers``, ``hidden_size``,
``ffn_hidden_size``, ``num_attention_heads``, ``num_query_groups`` for GQA), so a
Megatron or NeMo config maps across line by line.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mpsim.specs.base import Spec


class TransformerSpec(Spec):
    """Decoder-only transformer (GPT, Llama, ...)."""

    name: str
    description: str = ""
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0)
    ffn_type: Literal["gelu", "swiglu"] = "gelu"
    num_attention_heads: int = Field(gt=0)
    num_query_groups: int | None = Field(None, gt=0, description="KV heads (GQA); default: one per head")
    head_dim: int | None = Field(None, gt=0, description="default: hidden_size / num_attention_heads")
    vocab_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rope"] = "learned"
    tied_embeddings: bool = False
    linear_bias: bool = True
    dropout: float = Field(0.0, ge=0, lt=1, description="hidden and attention dropout probability")

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
