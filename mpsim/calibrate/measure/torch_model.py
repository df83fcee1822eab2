"""The small transformer the validation job trains, written to run the ops mpsim prices.

mpsim decomposes a pre-norm decoder layer into: norm, QKV GEMM, attention core, output
projection, residual add, norm, FC1, activation, FC2, residual add (see
``mpsim/workload/transformer.py``). This module writes the same layer in plain PyTorch,
one kernel per mpsim op where PyTorch allows, so that a measured action and a simulated
one are sums over the same list. Stage 0 adds the token and position embeddings, the
last stage the final norm and the LM head; the loss (cross entropy) is the schedule's
``loss_fn``, as ``torch.distributed.pipelining`` expects.

The attention core is written once (:func:`attention_core`) and used both by the model
and by the microbenchmark of the ``attn.flash`` op, so the head split and merge copies
the model makes are measured where they happen.

Everything here needs torch; import it only where torch is known to be installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class ModelShape:
    """The model of the validation job (read from an mpsim model file)."""

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_length: int
    norm: str = "layernorm"  # or "rmsnorm"
    flash_attention: bool = True
    bias: bool = True
    dtype: str = "fp32"  # mpsim's training.dtype: fp32 on a CPU, bf16 on a GPU

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def make_norm(shape: ModelShape) -> nn.Module:
    """The model's norm over the hidden dimension."""
    if shape.norm == "rmsnorm":
        return nn.RMSNorm(shape.hidden)
    return nn.LayerNorm(shape.hidden)


def causal_mask(seq_length: int, device: torch.device | str) -> torch.Tensor:
    """True above the diagonal: the scores a token may not attend to."""
    return torch.ones(seq_length, seq_length, dtype=torch.bool, device=device).triu(1)


def attention_core(qkv: torch.Tensor, heads: int, flash: bool, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V from a packed [b, s, 3h] QKV activation, back to [b, s, h].

    ``flash``: PyTorch's fused scaled-dot-product attention with a causal mask (mpsim's
    ``attn.flash``). Otherwise the unfused path mpsim prices as ``attn.scores``,
    ``attn.softmax`` and ``attn.context``: two batched GEMMs and a masked softmax with the
    full s x s scores in memory.
    """
    b, s, three_h = qkv.shape
    hidden = three_h // 3
    d = hidden // heads
    q, k, v = qkv.view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # each [b, heads, s, d]
    if flash:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        scores = torch.matmul(q, k.transpose(-1, -2)) * (d ** -0.5)
        if mask is None:
            mask = causal_mask(s, qkv.device)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        out = torch.matmul(probs, v)
    return out.transpose(1, 2).reshape(b, s, hidden)


class Block(nn.Module):
    """One pre-norm decoder layer (GELU MLP), as mpsim's ``layer_passes`` lists it."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.shape = shape
        self.attn_norm = make_norm(shape)
        self.qkv = nn.Linear(shape.hidden, 3 * shape.hidden, bias=shape.bias)
        self.proj = nn.Linear(shape.hidden, shape.hidden, bias=shape.bias)
        self.mlp_norm = make_norm(shape)
        self.fc1 = nn.Linear(shape.hidden, shape.ffn_hidden, bias=shape.bias)
        self.fc2 = nn.Linear(shape.ffn_hidden, shape.hidden, bias=shape.bias)
        # the unfused path's mask, made once (a buffer is not a parameter: no gradient)
        self.register_buffer("mask", causal_mask(shape.seq_length, "cpu"), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        core = attention_core(self.qkv(self.attn_norm(x)), self.shape.heads, self.shape.flash_attention, self.mask)
        x = x + self.proj(core)
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x))))


class Embedding(nn.Module):
    """Token plus learned position embedding (mpsim's ``embedding.lookup`` and ``.positions``)."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.positions = nn.Embedding(shape.seq_length, shape.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class Head(nn.Module):
    """Final norm and the logits GEMM (the loss is the schedule's ``loss_fn``)."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.norm = make_norm(shape)
        self.logits = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.norm(x))


class Chunk(nn.Module):
    """One pipeline stage (model chunk): optional embedding, some layers, optional head."""

    def __init__(self, shape: ModelShape, layers: int, first: bool, last: bool):
        super().__init__()
        self.embedding = Embedding(shape) if first else None
        self.blocks = nn.ModuleList(Block(shape) for _ in range(layers))
        self.head = Head(shape) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy over every token (mpsim's ``head.cross_entropy``)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build_chunk(shape: ModelShape, layers_per_chunk: list[int], stage: int, seed: int,
                device: torch.device) -> Chunk:
    """Stage ``stage`` of the model, its weights drawn from ``seed + stage`` (same on every run)."""
    torch.manual_seed(seed + stage)
    chunk = Chunk(shape, layers_per_chunk[stage], stage == 0, stage == len(layers_per_chunk) - 1)
    return chunk.to(device=device, dtype=TORCH_DTYPES[shape.dtype])


def batch(shape: ModelShape, sequences: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets for ``sequences`` sequences (deterministic)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, shape.vocab, (sequences, shape.seq_length + 1), generator=generator)
    return ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)
