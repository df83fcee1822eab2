"""A small hybrid image classifier: a convolutional stem, then transformer blocks, then a linear head.

It stands for "my own model" in docs/models.md: ``mpsim import-torch`` builds it on the
meta device, measures each part with PyTorch's FLOP counter and writes
``cnn_transformer.yaml``, a layer stack that ``cnn_transformer_scenario.yaml`` trains
with pipeline parallelism::

    mpsim import-torch examples/cnn_transformer.py:build --input-shape 3,64,64 -o examples/cnn_transformer.yaml
    mpsim run examples/cnn_transformer_scenario.yaml
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """A pre-norm transformer block (its residual connections keep it one pipeline unit)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class CNNTransformer(nn.Module):
    """Conv stem (two stride-2 convolutions) -> tokens -> transformer blocks -> mean -> classes."""

    def __init__(self, image: int = 64, dim: int = 256, depth: int = 8, heads: int = 8, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, dim, kernel_size=3, stride=2, padding=1), nn.BatchNorm2d(dim), nn.ReLU())
        self.position = nn.Parameter(torch.zeros(1, (image // 4) ** 2, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        x = x.flatten(2).transpose(1, 2) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def build() -> nn.Module:
    """The factory mpsim import-torch calls (on the meta device)."""
    return CNNTransformer()
