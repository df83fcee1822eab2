"""The layer kinds a layer stack is made of, and the shape each one produces.

Shapes are per sample (no batch dimension), in PyTorch's layouts: token layers see
``(tokens, features)`` (or ``(features,)``), 1-D convolutions ``(channels, length)``, 2-D
convolutions ``(channels, height, width)``, an embedding ``(tokens,)`` of ids. Each kind
knows the shape it makes of its input (:meth:`output_shape`) and refuses an input it
cannot take with a ``ValueError`` that the stack turns into an error naming the layer.
What each kind costs is in ``mpsim/workload/layers.py``; how tensor parallelism splits it
in ``mpsim/specs/stack_tp.py``.
"""

from __future__ import annotations

import math
from typing import Literal, Union

from pydantic import Field, model_validator

from mpsim.specs.base import Spec

Shape = tuple[int, ...]
TPSplit = Literal["auto", "column", "row", "replicate"]


def numel(shape: Shape) -> int:
    """Elements of one sample's tensor."""
    return math.prod(shape)


def _dim(shape: Shape, dim: int, what: str) -> int:
    if not -len(shape) <= dim < len(shape):
        raise ValueError(f"{what} {dim} does not exist in an input of shape {list(shape)}")
    return dim % len(shape)


def _pair(value: int | tuple[int, ...], dims: int, what: str) -> tuple[int, ...]:
    values = (value,) * dims if isinstance(value, int) else tuple(value)
    if len(values) != dims:
        raise ValueError(f"{what} needs {dims} values, got {list(values)}")
    return values


class LayerSpec(Spec):
    """Fields every layer has."""

    name: str | None = Field(None, description="label in reports and traces; default: kind and position")

    def output_shape(self, shape: Shape) -> Shape:
        return shape


class LinearLayer(LayerSpec):
    """``y = x W (+ b)`` over the last dimension (``nn.Linear``)."""

    kind: Literal["linear"]
    out_features: int = Field(gt=0)
    in_features: int | None = Field(None, gt=0, description="checked against the input when given")
    bias: bool = True
    tp: TPSplit = Field("auto", description="column (split outputs), row (split inputs, then a reduction), "
                                            "replicate (whole on every TP rank); auto alternates column and row")
    tie: str | None = Field(None, description="name of the embedding layer whose table this weight is (tied head)")

    def output_shape(self, shape: Shape) -> Shape:
        if not shape:
            raise ValueError("a linear layer needs at least one input dimension")
        if self.in_features is not None and shape[-1] != self.in_features:
            raise ValueError(f"in_features={self.in_features}, but the input has {shape[-1]} features")
        return (*shape[:-1], self.out_features)


class ConvLayer(LayerSpec):
    """1-D or 2-D convolution (``nn.Conv1d`` / ``nn.Conv2d``) on ``(channels, *spatial)``."""

    kind: Literal["conv1d", "conv2d"]
    out_channels: int = Field(gt=0)
    in_channels: int | None = Field(None, gt=0)
    kernel_size: int | tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] | Literal["same", "valid"] = 0
    dilation: int | tuple[int, ...] = 1
    groups: int = Field(1, gt=0)
    bias: bool = True
    tp: TPSplit = Field("auto", description="column splits output channels, row splits input channels; auto "
                                            "replicates (or closes a split as row)")

    @property
    def spatial_dims(self) -> int:
        return 1 if self.kind == "conv1d" else 2

    def geometry(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(kernel, stride, dilation) per spatial dimension."""
        n = self.spatial_dims
        return (_pair(self.kernel_size, n, "kernel_size"), _pair(self.stride, n, "stride"),
                _pair(self.dilation, n, "dilation"))

    def output_shape(self, shape: Shape) -> Shape:
        n = self.spatial_dims
        if len(shape) != n + 1:
            layout = "(channels, length)" if n == 1 else "(channels, height, width)"
            raise ValueError(f"{self.kind} needs an input {layout}, got {list(shape)}")
        channels, spatial = shape[0], shape[1:]
        if self.in_channels is not None and channels != self.in_channels:
            raise ValueError(f"in_channels={self.in_channels}, but the input has {channels} channels")
        if channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"groups={self.groups} must divide the {channels} input and {self.out_channels} "
                             f"output channels")
        kernel, stride, dilation = self.geometry()
        if self.padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError("padding 'same' needs stride 1 (as in PyTorch)")
            return (self.out_channels, *spatial)
        padding = (0,) * n if self.padding == "valid" else _pair(self.padding, n, "padding")
        out = tuple((size + 2 * p - d * (k - 1) - 1) // s + 1
                    for size, k, s, p, d in zip(spatial, kernel, stride, padding, dilation))
        if any(size < 1 for size in out):
            raise ValueError(f"the kernel does not fit the input {list(shape)}")
        return (self.out_channels, *out)


class RecurrentLayer(LayerSpec):
    """LSTM, GRU or plain (tanh) RNN over ``(tokens, features)``, possibly several layers deep."""

    kind: Literal["lstm", "gru", "rnn"]
    hidden_size: int = Field(gt=0)
    input_size: int | None = Field(None, gt=0)
    num_layers: int = Field(1, gt=0)
    bidirectional: bool = False
    bias: bool = True

    @property
    def gates(self) -> int:
        """Gate blocks per step: LSTM 4 (input, forget, cell, output), GRU 3, RNN 1."""
        return {"lstm": 4, "gru": 3, "rnn": 1}[self.kind]

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2:
            raise ValueError(f"{self.kind} needs an input (tokens, features), got {list(shape)}")
        if self.input_size is not None and shape[1] != self.input_size:
            raise ValueError(f"input_size={self.input_size}, but the input has {shape[1]} features")
        return (shape[0], self.hidden_size * self.directions)


class AttentionLayer(LayerSpec):
    """Multi-head self-attention with its QKV and output projections (``(tokens, features)`` in and out)."""

    kind: Literal["attention"]
    num_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(None, gt=0, description="key/value heads (GQA); default: num_heads")
    head_dim: int | None = Field(None, gt=0, description="default: features / num_heads")
    causal: bool = Field(False, description="mask future tokens (decoders); encoders attend to all tokens")
    kernel: Literal["auto", "flash", "unfused"] = Field("auto", description="auto: training.attention")
    bias: bool = True
    rope: bool = False
    dropout: float = Field(0.0, ge=0, lt=1, description="attention-probability dropout (unfused kernel)")

    @model_validator(mode="after")
    def _heads(self) -> "AttentionLayer":
        if self.num_heads % (self.num_kv_heads or self.num_heads):
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        return self

    def dims(self, features: int) -> tuple[int, int, int]:
        """(heads, kv heads, head size) for an input of ``features``."""
        if self.head_dim is None and features % self.num_heads:
            raise ValueError(f"{features} features do not split into {self.num_heads} heads; set head_dim")
        return self.num_heads, self.num_kv_heads or self.num_heads, self.head_dim or features // self.num_heads

    def output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2:
            raise ValueError(f"attention needs an input (tokens, features), got {list(shape)}")
        self.dims(shape[1])
        return shape


class NormLayer(LayerSpec):
    """Layer, RMS, batch or group normalization; the shape is unchanged."""

    kind: Literal["layernorm", "rmsnorm", "batchnorm", "groupnorm"]
    channel_dim: int | None = Field(None, description="the normalized (layer/RMS) or per-channel (batch/group) "
                                                      "dimension; default: last for layer/RMS, first for batch/group")
    num_groups: int | None = Field(None, gt=0, description="groupnorm only")
    bias: bool = Field(True, description="a learned shift beside the scale (never for rmsnorm)")

    def channel(self, shape: Shape) -> int:
        """Index of the channel dimension in ``shape``."""
        default = -1 if self.kind in ("layernorm", "rmsnorm") else 0
        return _dim(shape, default if self.channel_dim is None else self.channel_dim, "channel_dim")

    def params(self, shape: Shape) -> int:
        scale_and_shift = 1 if self.kind == "rmsnorm" or not self.bias else 2
        return scale_and_shift * shape[self.channel(shape)]

    def output_shape(self, shape: Shape) -> Shape:
        if not shape:
            raise ValueError(f"{self.kind} needs at least one input dimension")
        channels = shape[self.channel(shape)]
        if self.kind == "groupnorm" and (self.num_groups is None or channels % self.num_groups):
            raise ValueError(f"groupnorm needs num_groups dividing its {channels} channels")
        return shape


class EmbeddingLayer(LayerSpec):
    """Table lookup of token ids ``(tokens,)`` -> ``(tokens, embedding_dim)``, plus learned positions."""

    kind: Literal["embedding"]
    num_embeddings: int = Field(gt=0)
    embedding_dim: int = Field(gt=0)
    positions: int = Field(0, ge=0, description="rows of a learned position table added to the lookup (0: none)")
    dropout: float = Field(0.0, ge=0, lt=1)

    def output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 1:
            raise ValueError(f"an embedding takes token ids (tokens,), got {list(shape)}")
        if self.positions and shape[0] > self.positions:
            raise ValueError(f"{shape[0]} tokens exceed the {self.positions} learned positions")
        return (shape[0], self.embedding_dim)


class PoolLayer(LayerSpec):
    """Average or max pooling over windows, or over all positions; ``first`` keeps the first token."""

    kind: Literal["pool"]
    mode: Literal["avg", "max", "first"] = "avg"
    kernel_size: int | tuple[int, ...] | None = Field(None, description="None: pool over all positions")
    stride: int | tuple[int, ...] | None = Field(None, description="default: kernel_size")
    padding: int | tuple[int, ...] = 0
    channel_dim: int = Field(0, description="the dimension kept; the others are pooled (0: (channels, *spatial))")

    def output_shape(self, shape: Shape) -> Shape:
        if len(shape) < 2:
            raise ValueError(f"pooling needs a channel and at least one position dimension, got {list(shape)}")
        channel = _dim(shape, self.channel_dim, "channel_dim")
        if self.kernel_size is None or self.mode == "first":
            return (shape[channel],)
        if channel != 0:
            raise ValueError("window pooling needs the channels first (channel_dim 0)")
        n = len(shape) - 1
        kernel = _pair(self.kernel_size, n, "kernel_size")
        stride = _pair(self.stride if self.stride is not None else self.kernel_size, n, "stride")
        padding = _pair(self.padding, n, "padding")
        out = tuple((size + 2 * p - k) // s + 1 for size, k, s, p in zip(shape[1:], kernel, stride, padding))
        if any(size < 1 for size in out):
            raise ValueError(f"the pooling window does not fit the input {list(shape)}")
        return (shape[0], *out)


# elementwise ops: HBM bytes per element (in units of the activation size, plus dropout
# mask bytes) forward and backward, and what the backward needs kept
ELEMENTWISE_OPS = ("gelu", "relu", "silu", "tanh", "sigmoid", "hardtanh", "swiglu", "geglu", "dropout", "add",
                   "bias_dropout_add", "scale")


class ElementwiseLayer(LayerSpec):
    """An activation, dropout, residual add or scale; ``swiglu``/``geglu`` halve the last dimension."""

    kind: Literal["elementwise"]
    op: Literal[ELEMENTWISE_OPS]  # type: ignore[valid-type]
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout probability (dropout, bias_dropout_add)")
    params: int = Field(0, ge=0, description="a learned tensor the op uses, e.g. a position table it adds")

    def output_shape(self, shape: Shape) -> Shape:
        if self.op in ("swiglu", "geglu"):
            if not shape or shape[-1] % 2:
                raise ValueError(f"{self.op} splits the last dimension into gate and value; it must be even")
            return (*shape[:-1], shape[-1] // 2)
        return shape


class ViewLayer(LayerSpec):
    """A reshape, flatten, transpose or permute: no work, a new per-sample shape of as many elements."""

    kind: Literal["view"]
    shape: tuple[int, ...] = Field(description="per-sample output shape; one entry may be -1")

    def output_shape(self, shape: Shape) -> Shape:
        target = list(self.shape)
        if target.count(-1) > 1 or any(d == 0 or d < -1 for d in target):
            raise ValueError(f"shape {target} may hold one -1 and positive sizes")
        known = math.prod(d for d in target if d != -1)
        if -1 in target:
            if numel(shape) % known:
                raise ValueError(f"{numel(shape)} elements do not fit shape {target}")
            target[target.index(-1)] = numel(shape) // known
        if math.prod(target) != numel(shape):
            raise ValueError(f"shape {target} holds {math.prod(target)} elements, the input {numel(shape)}")
        return tuple(target)


class CrossEntropyLayer(LayerSpec):
    """Softmax cross entropy over the last dimension (classes or vocabulary); the loss ends the stack."""

    kind: Literal["cross_entropy"]

    def output_shape(self, shape: Shape) -> Shape:
        if not shape:
            raise ValueError("cross entropy needs a class dimension")
        return ()


class CustomLayer(LayerSpec):
    """A layer given by its costs per sample (what mpsim import-torch writes for unknown modules)."""

    kind: Literal["custom"]
    forward_flops: float = Field(ge=0, description="per sample")
    backward_flops: float | None = Field(None, ge=0, description="per sample; default 2 x forward")
    weight_grad_fraction: float = Field(0.5, ge=0, le=1, description="share of the backward FLOPs that are "
                                                                     "weight gradients (0 without parameters)")
    bytes: float | None = Field(None, ge=0, description="HBM bytes moved by the forward per sample; default: "
                                                        "input, output and weights once; the backward moves twice")
    params: int = Field(0, ge=0)
    activation_bytes: float | None = Field(None, ge=0, description="kept for the backward per sample; default: "
                                                                   "the input")
    output_shape_: tuple[int, ...] | None = Field(None, alias="output_shape",
                                                  description="per-sample output shape; default: the input's")
    tp: Literal["none", "replicate"] = Field("none", description="replicate: the whole layer on every TP rank")

    def output_shape(self, shape: Shape) -> Shape:
        return tuple(self.output_shape_) if self.output_shape_ is not None else shape


Layer = Union[LinearLayer, ConvLayer, RecurrentLayer, AttentionLayer, NormLayer, EmbeddingLayer, PoolLayer,
              ElementwiseLayer, ViewLayer, CrossEntropyLayer, CustomLayer]

LAYER_KINDS: dict[str, type[LayerSpec]] = {}
for _cls in (LinearLayer, ConvLayer, RecurrentLayer, AttentionLayer, NormLayer, EmbeddingLayer, PoolLayer,
             ElementwiseLayer, ViewLayer, CrossEntropyLayer, CustomLayer):
    for _kind in _cls.model_fields["kind"].annotation.__args__:  # type: ignore[union-attr]
        LAYER_KINDS[_kind] = _cls
