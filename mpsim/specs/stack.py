"""A model as an ordered stack of layers: the second model kind beside the transformer.

A model file with ``kind: stack`` lists its layers in the order data flows through them,
each of a known kind (``mpsim/specs/layers.py``) or given by its costs (``custom``). A
``block`` repeats a group of layers (a transformer block, a conv stage)::

    kind: stack
    name: tiny-vit
    input_shape: [3, 224, 224]          # one sample, no batch dimension
    layers:
      - {kind: conv2d, name: patches, out_channels: 768, kernel_size: 16, stride: 16, tp: replicate}
      - {kind: view, shape: [768, 196]}
      - {kind: view, shape: [196, 768]}
      - kind: block
        name: encoder
        repeat: 12
        layers:
          - {kind: layernorm}
          - {kind: attention, num_heads: 12}
          ...

Pipeline parallelism cuts the stack between *units*: each top-level layer is one unit,
and a block is ``repeat`` units (``parallel.layers_per_stage`` counts units). Shapes are
inferred from ``input_shape`` layer by layer when the file is loaded, so a wrong size is
reported against the layer that cannot take it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from mpsim.specs.base import Spec
from mpsim.specs.layers import (LAYER_KINDS, CrossEntropyLayer, EmbeddingLayer, Layer, LayerSpec, LinearLayer, Shape)


def input_error(loc: tuple, message: str, value: Any = None) -> ValidationError:
    """A validation error at ``loc`` (relative to the model being validated) with a plain message."""
    return ValidationError.from_exception_data("layer stack", [InitErrorDetails(
        type=PydanticCustomError("value_error", message.replace("{", "(").replace("}", ")")), loc=loc,
        input=value)])


def _relocated(exc: ValidationError, prefix: tuple) -> ValidationError:
    """The errors of ``exc`` with ``prefix`` put in front of their locations (types and messages kept)."""
    details = []
    for error in exc.errors(include_url=False):
        detail = InitErrorDetails(type=error["type"], loc=(*prefix, *error["loc"]), input=error.get("input"))
        if "ctx" in error:
            detail["ctx"] = error["ctx"]
        try:  # a standard pydantic error type re-creates its own message
            ValidationError.from_exception_data("check", [detail])
        except (KeyError, TypeError, ValueError):
            detail = InitErrorDetails(type=PydanticCustomError("value_error", error["msg"].replace("{", "(")
                                                               .replace("}", ")")),
                                      loc=detail["loc"], input=detail["input"])
        details.append(detail)
    return ValidationError.from_exception_data("layer stack", details)


def parse_layer(value: Any, index: int, allow_block: bool) -> Any:
    """One layer from its mapping: the class its ``kind`` names, errors located at ``index``."""
    if isinstance(value, (LayerSpec, BlockLayer)):
        return value
    if not isinstance(value, dict):
        raise input_error((index,), "a layer is a mapping with a kind, e.g. {kind: linear, out_features: 1024}", value)
    kind = value.get("kind")
    cls: Any = BlockLayer if kind == "block" and allow_block else LAYER_KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        known = ", ".join(sorted([*LAYER_KINDS, *(["block"] if allow_block else [])]))
        hint = "" if kind != "block" else " (blocks do not nest)"
        raise input_error((index, "kind"), f"unknown layer kind {kind!r}{hint}; known: {known}", kind)
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        raise _relocated(exc, (index,)) from None


def parse_layers(value: Any, allow_block: bool) -> Any:
    """A ``layers`` list parsed layer by layer (anything else is left for pydantic to reject)."""
    if not isinstance(value, (list, tuple)):
        return value
    return tuple(parse_layer(item, i, allow_block) for i, item in enumerate(value))


class BlockLayer(Spec):
    """A group of layers run ``repeat`` times in a row; each repetition is one pipeline unit."""

    kind: Literal["block"]
    name: str = "block"
    repeat: int = Field(1, gt=0)
    layers: tuple[Layer, ...] = Field(min_length=1)

    @field_validator("layers", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return parse_layers(value, allow_block=False)


@dataclass(frozen=True)
class PlacedLayer:
    """A layer at its place in the stack: where it is in the file, its label, its input and output shapes."""

    layer: Layer
    path: str  # dotted field path in the model file, e.g. "layers.3.layers.1"
    label: str
    in_shape: Shape
    out_shape: Shape

    @property
    def kind(self) -> str:
        return self.layer.kind


@dataclass(frozen=True)
class Unit:
    """What pipeline parallelism cannot cut: one top-level layer, or one repetition of a block."""

    label: str
    layers: tuple[PlacedLayer, ...]

    @property
    def in_shape(self) -> Shape:
        return self.layers[0].in_shape

    @property
    def out_shape(self) -> Shape:
        return self.layers[-1].out_shape

    @property
    def has_embedding(self) -> bool:
        return any(isinstance(p.layer, EmbeddingLayer) for p in self.layers)

    @property
    def has_loss(self) -> bool:
        return any(isinstance(p.layer, CrossEntropyLayer) for p in self.layers)


class LayerStackSpec(Spec):
    """Any model as an ordered stack of layers (CNNs, RNNs, encoders, hybrids, imported PyTorch modules)."""

    kind: Literal["stack"]
    name: str
    description: str = ""
    input_shape: tuple[int, ...] = Field(min_length=1, description="one sample's input, without the batch "
                                                                   "dimension; token ids (tokens,) before an embedding")
    tokens_per_sample: int = Field(1, gt=0, description="what one sample counts as in tokens/s (e.g. the sequence "
                                                        "length of a language model; 1 reports samples/s)")
    sample_kind: Literal["sequence", "image", "audio", "sample"] | None = Field(
        None, description="what one sample is, which names the throughput unit: sequence (tokens/s, "
                          "tokens_per_sample each), image (images/s), audio (samples/s, and audio seconds/s with "
                          "audio_seconds_per_sample) or sample (samples/s); default: sequence when tokens_per_sample "
                          "is above 1, else sample")
    audio_seconds_per_sample: float | None = Field(None, gt=0, description="seconds of audio in one sample "
                                                                           "(sample_kind audio only)")
    layers: tuple[Layer | BlockLayer, ...] = Field(min_length=1)

    @field_validator("layers", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return parse_layers(value, allow_block=True)

    @field_validator("input_shape")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in value):
            raise ValueError(f"sizes must be positive, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _audio_seconds(self) -> "LayerStackSpec":
        if self.audio_seconds_per_sample is not None and self.sample_kind != "audio":
            raise input_error(("audio_seconds_per_sample",), "is only meaningful with sample_kind: audio, but "
                              f"sample_kind is {self.sample_kind or 'not given'}", self.audio_seconds_per_sample)
        return self

    @model_validator(mode="after")
    def _shapes(self) -> "LayerStackSpec":
        units = stack_units(self)  # infers every shape; errors name the layer
        names = [p.layer.name for unit in units for p in unit.layers if isinstance(p.layer, EmbeddingLayer)]
        for unit in units:
            for placed in unit.layers:
                tie = getattr(placed.layer, "tie", None)
                if tie is not None and tie not in names:
                    raise input_error(_loc(placed.path, "tie"), f"no embedding layer named {tie!r} to tie to", tie)
        return self

    @property
    def num_layers(self) -> int:
        """Pipeline units (what ``parallel.layers_per_stage`` counts)."""
        return len(stack_units(self))

    @property
    def seq_length(self) -> int:
        """Tokens per sample for throughput (the transformer's field of the same name)."""
        return self.tokens_per_sample

    @property
    def tied_embeddings(self) -> bool:
        """True when a linear layer shares an embedding's table (its gradient is synchronized between stages)."""
        return any(isinstance(p.layer, LinearLayer) and p.layer.tie for u in stack_units(self) for p in u.layers)

    @property
    def hidden_size(self) -> int:
        """Width of the tied embedding (what its gradient all-reduce moves per row); 0 without one."""
        return tied_embedding(self).embedding_dim if self.tied_embeddings else 0

    # the transformer-only features a stack never has
    moe: ClassVar[None] = None
    mla: ClassVar[None] = None


def tied_embedding(stack: LayerStackSpec) -> EmbeddingLayer:
    """The embedding a tied linear layer shares its table with."""
    for unit in stack_units(stack):
        for placed in unit.layers:
            if isinstance(placed.layer, LinearLayer) and placed.layer.tie:
                for other in stack_units(stack):
                    for candidate in other.layers:
                        if isinstance(candidate.layer, EmbeddingLayer) and candidate.layer.name == placed.layer.tie:
                            return candidate.layer
    raise LookupError("no tied embedding")


def _loc(path: str, *more: str) -> tuple:
    return (*(int(part) if part.isdigit() else part for part in path.split(".")), *more)


@lru_cache(maxsize=64)
def stack_units(stack: LayerStackSpec) -> tuple[Unit, ...]:
    """The stack's pipeline units with every layer's input and output shape (cached per spec)."""
    units: list[Unit] = []
    shape: Shape = tuple(stack.input_shape)
    counts: dict[str, int] = {}
    for index, entry in enumerate(stack.layers):
        if isinstance(entry, BlockLayer):
            for repetition in range(entry.repeat):
                placed = []
                for inner, layer in enumerate(entry.layers):
                    path = f"layers.{index}.layers.{inner}"
                    label = f"{entry.name} {repetition}.{layer.name or f'{layer.kind}{inner}'}"
                    shape = _place(layer, path, label, shape, placed, first=not units and not placed)
                units.append(Unit(f"{entry.name} {repetition}", tuple(placed)))
        else:
            counts[entry.kind] = counts.get(entry.kind, 0) + 1
            label = entry.name or f"{entry.kind}{counts[entry.kind] - 1}"
            placed = []
            shape = _place(entry, f"layers.{index}", label, shape, placed, first=not units)
            units.append(Unit(label, tuple(placed)))
    return tuple(units)  # a stack may end without a loss: the backward then starts from its output


def _place(layer: Layer, path: str, label: str, shape: Shape, placed: list[PlacedLayer], first: bool) -> Shape:
    """Append ``layer`` at ``path`` with its shapes; return its output shape."""
    if shape == ():
        raise input_error(_loc(path), f"layer {label!r} comes after the loss; cross_entropy must be last")
    if isinstance(layer, EmbeddingLayer) and not first:
        raise input_error(_loc(path), f"embedding {label!r} takes token ids, so it must be the first layer")
    try:
        out = tuple(layer.output_shape(tuple(shape)))
    except ValueError as exc:
        raise input_error(_loc(path), f"layer {label!r} ({layer.kind}, input {list(shape)}): {exc}") from None
    placed.append(PlacedLayer(layer, path, label, tuple(shape), out))
    return out
