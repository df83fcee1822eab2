"""How tensor parallelism splits each layer of a stack (Megatron's column/row plan).

Megatron-LM (Shoeybi et al. 2019) splits a linear layer either by its outputs
(*column*-parallel: each rank computes a slice of the features, no communication in the
forward) or by its inputs (*row*-parallel: each rank holds a slice of the features and
the partial outputs are summed by an all-reduce). A column layer followed by a row layer
needs one collective for the pair, with elementwise work on the feature shards between
them. Attention splits by heads (its QKV projection is column-, its output projection
row-parallel), an embedding and the loss by vocabulary. Convolutions split the same way
by output or input channels.

This module walks a stack at a given ``tp`` and assigns each layer its split, tracking
whether the activation between layers is whole or split over the TP ranks. A layer
that cannot work on what it receives is an error naming it: recurrent layers have no
TP split at all, a layer norm cannot normalize features it holds a slice of, a pipeline
unit must not end with its features still split. With sequence parallelism (Korthikanti
et al. 2022) the whole activations are split by tokens instead; layers that mix tokens
(convolutions, pooling, recurrence, batch statistics) cannot take that.
"""

from __future__ import annotations

from functools import lru_cache

from mpsim.errors import InputError
from mpsim.specs.layers import (AttentionLayer, ConvLayer, CrossEntropyLayer, CustomLayer, ElementwiseLayer,
                                EmbeddingLayer, LinearLayer, NormLayer, PoolLayer, RecurrentLayer, ViewLayer)
from mpsim.specs.stack import LayerStackSpec, PlacedLayer, stack_units

# modes: column / row / replicate (linear, conv, custom), heads (attention), vocab
# (embedding; cross entropy on a split input), whole (the layer on whole activations),
# shard (an elementwise, per-channel or pooling layer on its slice of split features)


def _fail(placed: PlacedLayer, message: str) -> InputError:
    return InputError(f"layer {placed.label!r} ({placed.kind}) {message}", field=f"model.{placed.path}")


def _split_dim(placed: PlacedLayer) -> int:
    """The dimension a column layer splits: features (last) for linear, channels (first) for conv."""
    return 0 if isinstance(placed.layer, ConvLayer) else len(placed.out_shape) - 1


@lru_cache(maxsize=64)
def plan_tensor_parallel(stack: LayerStackSpec, tp: int, sequence_parallel: bool) -> tuple[tuple[str, ...], ...]:
    """The TP mode of every layer, unit by unit; an :class:`InputError` names a layer that cannot be split."""
    units = stack_units(stack)
    if tp == 1:
        return tuple(tuple(_single(p) for p in unit.layers) for unit in units)
    for unit in units:  # a layer with no split at all is the error to report, whatever else is wrong
        for placed in unit.layers:
            if isinstance(placed.layer, RecurrentLayer) or (isinstance(placed.layer, CustomLayer)
                                                           and placed.layer.tp != "replicate"):
                _mode(placed, tp, None)
    plan = []
    split: int | None = None  # the split dimension of the activation between layers, or None when whole
    opener: PlacedLayer | None = None
    for unit in units:
        modes = []
        for placed in unit.layers:
            mode, split = _mode(placed, tp, split)
            if mode in ("column",):
                opener = placed
            if sequence_parallel:
                _check_sequence_parallel(placed, mode, tp)
            modes.append(mode)
        if split is not None:
            assert opener is not None
            raise _fail(opener, f"splits its outputs over tensor parallelism (column), but unit {unit.label!r} ends "
                                f"before a row-parallel layer joins them; keep the pair in one block or set tp: "
                                f"replicate")
        plan.append(tuple(modes))
    return tuple(plan)


def _single(placed: PlacedLayer) -> str:
    """Modes at tp=1: nothing is split, every layer runs whole."""
    layer = placed.layer
    if isinstance(layer, (LinearLayer, ConvLayer, CustomLayer)):
        return "replicate"
    return {AttentionLayer: "heads", EmbeddingLayer: "vocab"}.get(type(layer), "whole")


def _mode(placed: PlacedLayer, tp: int, split: int | None) -> tuple[str, int | None]:
    """(mode, split dimension after the layer) of one layer at tp > 1."""
    layer = placed.layer
    shape = placed.in_shape
    if isinstance(layer, RecurrentLayer):
        raise _fail(placed, f"cannot be split over tensor parallelism (tp={tp}): its steps depend on each other "
                            f"through the whole hidden state; use tp=1 (pipeline and data parallelism)")
    if isinstance(layer, CustomLayer):
        if layer.tp != "replicate":
            raise _fail(placed, f"has no tensor-parallel split (tp={tp}); set tp: replicate to run it whole on "
                                f"every TP rank, or use tp=1")
        if split is not None:
            raise _fail(placed, "receives features split over tensor parallelism; it can only run on whole ones")
        return "replicate", None
    if isinstance(layer, (LinearLayer, ConvLayer)):
        return _weight_layer(placed, tp, split)
    if isinstance(layer, AttentionLayer):
        heads, kv_heads, _ = layer.dims(shape[-1])
        if split is not None:
            raise _fail(placed, "receives features split over tensor parallelism; put a row-parallel layer before it")
        if heads % tp or kv_heads % tp:
            raise _fail(placed, f"splits by heads, but tp={tp} does not divide its {heads} heads and {kv_heads} "
                                f"key/value heads")
        return "heads", None
    if isinstance(layer, EmbeddingLayer):
        if layer.num_embeddings % tp:
            raise _fail(placed, f"splits its table over tp={tp}, which does not divide num_embeddings="
                                f"{layer.num_embeddings}")
        return "vocab", None
    if isinstance(layer, CrossEntropyLayer):
        if split is None:
            return "whole", None
        if split != len(shape) - 1:
            raise _fail(placed, "needs its classes (the last dimension) split, not another dimension")
        return "vocab", None
    if split is None:
        return "whole", None
    if isinstance(layer, ElementwiseLayer):
        return "shard", split
    if isinstance(layer, NormLayer):
        channel = layer.channel(shape)
        per_channel = layer.kind in ("batchnorm", "groupnorm")
        if per_channel and channel == split and (layer.kind == "batchnorm" or (layer.num_groups or 1) % tp == 0):
            return "shard", split
        if not per_channel and channel != split:
            return "shard", split
        raise _fail(placed, "cannot normalize features it holds a slice of; put a row-parallel layer before it")
    if isinstance(layer, PoolLayer):
        if layer.channel_dim % len(shape) == split:
            return "shard", (0 if layer.kernel_size is None or layer.mode == "first" else split)
        raise _fail(placed, "pools over the dimension split by tensor parallelism; put a row-parallel layer before it")
    assert isinstance(layer, ViewLayer)
    raise _fail(placed, "reshapes features split over tensor parallelism; put a row-parallel layer before it")


def _weight_layer(placed: PlacedLayer, tp: int, split: int | None) -> tuple[str, int | None]:
    """Column, row or replicate for a linear or convolution layer."""
    layer = placed.layer
    assert isinstance(layer, (LinearLayer, ConvLayer))
    is_conv = isinstance(layer, ConvLayer)
    # auto: linear layers alternate column and row (Megatron's MLP); a convolution is
    # replicated unless it closes a split (vision front-ends are small next to their blocks)
    want = layer.tp if layer.tp != "auto" else ("row" if split is not None else "replicate" if is_conv else "column")
    outputs = layer.out_channels if is_conv else layer.out_features
    inputs = placed.in_shape[0] if is_conv else placed.in_shape[-1]
    if want == "replicate":
        if split is not None:
            raise _fail(placed, "receives features split over tensor parallelism, so it cannot be replicated; "
                                "make it row-parallel")
        return "replicate", None
    if is_conv and layer.groups > 1:
        raise _fail(placed, f"is a grouped convolution (groups={layer.groups}), which has no tensor-parallel "
                            f"split here; set tp: replicate")
    if want == "column":
        if split is not None:
            raise _fail(placed, "is column-parallel but receives split features; make it row-parallel (or auto)")
        if outputs % tp:
            raise _fail(placed, f"splits its {outputs} outputs over tp={tp}, which does not divide them")
        return "column", _split_dim(placed)
    if split is None:
        raise _fail(placed, "is row-parallel but receives whole features; put a column-parallel layer before it")
    if split != (0 if is_conv else len(placed.in_shape) - 1) or inputs % tp:
        raise _fail(placed, f"is row-parallel over its {inputs} inputs, which the previous split does not match")
    return "row", None


def _check_sequence_parallel(placed: PlacedLayer, mode: str, tp: int) -> None:
    """Under sequence parallelism whole activations are split by tokens: only token-wise layers take that."""
    layer = placed.layer
    token_wise = (isinstance(layer, (ElementwiseLayer, AttentionLayer, EmbeddingLayer))
                  or (isinstance(layer, NormLayer) and layer.kind in ("layernorm", "rmsnorm")
                      and layer.channel(placed.in_shape) == len(placed.in_shape) - 1)
                  or (isinstance(layer, LinearLayer) and mode in ("column", "row"))
                  or (isinstance(layer, CrossEntropyLayer) and mode == "vocab"))
    if not token_wise:
        raise _fail(placed, "does not work on a sequence split over tensor-parallel ranks; set "
                            "parallel.sequence_parallel: false")
    shape = placed.out_shape if isinstance(layer, EmbeddingLayer) else placed.in_shape
    tokens = 1
    for size in shape[:-1]:
        tokens *= size
    if mode != "shard" and tokens % tp:
        raise _fail(placed, f"has {tokens} tokens, which sequence parallelism cannot split over tp={tp}")
