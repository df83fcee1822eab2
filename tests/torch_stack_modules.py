"""A layer stack as PyTorch modules, to count its FLOPs with PyTorch's own counter.

Each layer kind maps to the module PyTorch users would write for it (``nn.Linear``,
``nn.Conv2d``, ``nn.GRU``, ``scaled_dot_product_attention`` between two linear
projections, ``nn.LayerNorm``, ...). Run on the meta device under
``torch.utils.flop_counter.FlopCounterMode``, they give an independent count of each
layer's forward FLOPs to hold the stack's formulas against (tests/test_torch_import.py).
Custom layers carry their own costs and have no module; they come out as a placeholder
of the right shape.
"""

from __future__ import annotations

import math

from mpsim.specs.layers import (AttentionLayer, ConvLayer, CrossEntropyLayer, CustomLayer, ElementwiseLayer,
                                EmbeddingLayer, LinearLayer, NormLayer, PoolLayer, RecurrentLayer, ViewLayer)
from mpsim.specs.stack import LayerStackSpec, PlacedLayer, stack_units
from mpsim.torchio import require_torch

torch = require_torch()  # the tests that import this module skip first when torch is missing
nn = torch.nn
F = torch.nn.functional


class Lambda(nn.Module):
    """A module around a function of the batch (reshapes, residual adds, pooling over tokens)."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for name, value in params.items():
            setattr(self, name, value)

    def forward(self, x):
        return self.fn(self, x)


class SelfAttention(nn.Module):
    """QKV projection, scaled dot-product attention, output projection."""

    def __init__(self, features: int, heads: int, kv_heads: int, head_dim: int, causal: bool, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.causal = heads, kv_heads, head_dim, causal
        self.qkv = nn.Linear(features, (heads + 2 * kv_heads) * head_dim, bias=bias)
        self.proj = nn.Linear(heads * head_dim, features, bias=bias)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2) for z in (k, v))
        if self.kv_heads != self.heads:
            k, v = (z.repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


def _channels_last(module: nn.Module, dim: int, rank: int) -> nn.Module:
    """``module`` (which normalizes dim 1 of a batch) applied to the per-sample dimension ``dim``."""
    axis = dim % rank + 1
    if axis == 1:
        return module
    return Lambda(lambda self, x: self.inner(x.movedim(axis, 1)).movedim(1, axis), inner=module)


_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
                "hardtanh": lambda: nn.Hardtanh(0, 20)}


def layer_module(placed: PlacedLayer) -> nn.Module:
    """The PyTorch module of one placed layer (batch dimension first)."""
    layer, shape = placed.layer, placed.in_shape
    if isinstance(layer, LinearLayer):
        return nn.Linear(shape[-1], layer.out_features, bias=layer.bias)
    if isinstance(layer, ConvLayer):
        conv = nn.Conv1d if layer.kind == "conv1d" else nn.Conv2d
        padding = layer.padding if isinstance(layer.padding, (str, int)) else tuple(layer.padding)
        return conv(shape[0], layer.out_channels, layer.kernel_size, stride=layer.stride, padding=padding,
                    dilation=layer.dilation, groups=layer.groups, bias=layer.bias)
    if isinstance(layer, RecurrentLayer):
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[layer.kind]
        rnn = cls(shape[-1], layer.hidden_size, num_layers=layer.num_layers, bias=layer.bias, batch_first=True,
                  bidirectional=layer.bidirectional)
        return Lambda(lambda self, x: self.rnn(x)[0], rnn=rnn)
    if isinstance(layer, AttentionLayer):
        heads, kv_heads, head_dim = layer.dims(shape[-1])
        return SelfAttention(shape[-1], heads, kv_heads, head_dim, layer.causal, layer.bias)
    if isinstance(layer, NormLayer):
        channel, channels = layer.channel(shape), shape[layer.channel(shape)]
        if layer.kind == "layernorm":
            return _channels_last(Lambda(lambda self, x: self.norm(x.movedim(1, -1)).movedim(-1, 1),
                                         norm=nn.LayerNorm(channels, bias=layer.bias)), channel, len(shape))
        if layer.kind == "rmsnorm":
            return _channels_last(Lambda(lambda self, x: self.norm(x.movedim(1, -1)).movedim(-1, 1),
                                         norm=nn.RMSNorm(channels)), channel, len(shape))
        if layer.kind == "groupnorm":
            return _channels_last(nn.GroupNorm(layer.num_groups, channels), channel, len(shape))
        batch_norm = nn.BatchNorm1d if len(shape) <= 2 else nn.BatchNorm2d
        return _channels_last(batch_norm(channels), channel, len(shape))
    if isinstance(layer, EmbeddingLayer):
        table = nn.Embedding(layer.num_embeddings, layer.embedding_dim)
        if not layer.positions:
            return table
        positions = nn.Parameter(torch.empty(layer.positions, layer.embedding_dim))
        return Lambda(lambda self, x: self.table(x) + self.positions[: x.shape[1]], table=table, positions=positions)
    if isinstance(layer, PoolLayer):
        return _pool(placed, layer)
    if isinstance(layer, ElementwiseLayer):
        return _elementwise(layer)
    if isinstance(layer, ViewLayer):
        return Lambda(lambda self, x: x.reshape(x.shape[0], *placed.out_shape))
    if isinstance(layer, CrossEntropyLayer):
        return Lambda(lambda self, x: F.cross_entropy(x.reshape(-1, x.shape[-1]), torch.zeros(
            math.prod(x.shape[:-1]), dtype=torch.long, device=x.device)))
    assert isinstance(layer, CustomLayer)
    return Lambda(lambda self, x: x.new_empty((x.shape[0], *placed.out_shape)))


def _pool(placed: PlacedLayer, layer: PoolLayer) -> nn.Module:
    rank = len(placed.in_shape)
    channel = layer.channel_dim % rank + 1
    if layer.mode == "first":
        return Lambda(lambda self, x: x.movedim(channel, -1).flatten(1, -2)[:, 0])
    if layer.kernel_size is None:
        dims = tuple(d for d in range(1, rank + 1) if d != channel)
        if layer.mode == "avg":
            return Lambda(lambda self, x: x.mean(dim=dims))
        return Lambda(lambda self, x: x.amax(dim=dims))
    cls = {("avg", 2): nn.AvgPool1d, ("avg", 3): nn.AvgPool2d, ("max", 2): nn.MaxPool1d,
           ("max", 3): nn.MaxPool2d}[(layer.mode, rank)]
    return cls(layer.kernel_size, stride=layer.stride, padding=layer.padding)


def _elementwise(layer: ElementwiseLayer) -> nn.Module:
    if layer.op in _ACTIVATIONS:
        return _ACTIVATIONS[layer.op]()
    if layer.op in ("swiglu", "geglu"):
        act = F.silu if layer.op == "swiglu" else F.gelu
        return Lambda(lambda self, x: act(x.chunk(2, dim=-1)[0]) * x.chunk(2, dim=-1)[1])
    if layer.op == "dropout":
        return nn.Dropout(layer.dropout)
    if layer.op == "bias_dropout_add":
        return Lambda(lambda self, x: self.drop(x) + x, drop=nn.Dropout(layer.dropout))
    if layer.op == "scale":
        return Lambda(lambda self, x: x * 0.5)
    return Lambda(lambda self, x: x + x)  # add: a residual, the same tensor for the count


def layer_flops(stack: LayerStackSpec, batch: int = 1) -> list[tuple[PlacedLayer, float]]:
    """(layer, forward FLOPs per sample by PyTorch's FLOP counter) for every layer, on the meta device."""
    import warnings

    from torch.utils.flop_counter import FlopCounterMode

    warnings.filterwarnings("ignore", message="Using padding='same'", category=UserWarning)
    placed_layers = [placed for unit in stack_units(stack) for placed in unit.layers]
    with torch.device("meta"):
        first = placed_layers[0].layer
        if isinstance(first, EmbeddingLayer):
            x = torch.zeros((batch, *stack.input_shape), dtype=torch.long)
        else:
            x = torch.empty((batch, *stack.input_shape))
        results = []
        counted: dict[tuple, float] = {}  # repeated layers (a block's repetitions) are counted once
        for placed in placed_layers:
            key = (placed.layer, placed.in_shape)
            if key in counted:
                x = x.new_empty((batch, *placed.out_shape))
            else:
                module = layer_module(placed)
                with FlopCounterMode(display=False) as counter:
                    x = module(x)
                counted[key] = counter.get_total_flops() / batch
            results.append((placed, counted[key]))
    return results
