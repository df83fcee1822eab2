"""Transformer blocks read as typed layers, so that tensor parallelism can split them.

An imported unit that is a transformer block (a Hugging Face ``LlamaDecoderLayer``,
``GPT2Block`` or ``BertLayer``, or a user's block built the same way) would otherwise be
a ``custom`` layer: measured, pipelined, never split. Here the modules it calls, in call
order, are matched against the parts of a block:

* a norm (``nn.LayerNorm``, an RMSNorm);
* self-attention: ``nn.MultiheadAttention`` (batch first), or three projections of one
  input (query, key, value) or one fused projection, then an output projection back to
  the model width; heads, key/value heads
  and head size from the attention module's attributes, the causal mask from its
  ``is_causal``, rotary embeddings when the block is handed ``position_embeddings``;
* an MLP: one or two projections up (two is a gated MLP: SwiGLU after SiLU, GeGLU after
  GELU), an activation, one projection down;
* dropouts.

A residual add follows the attention's and the MLP's output projection. The block becomes
a ``block`` of those layers only if their shapes chain from the block's input to its
output and the stack's formulas give PyTorch's counted FLOPs within ``FLOP_TOLERANCE``;
anything else stays ``custom``. Linear-like modules are ``nn.Linear`` and Hugging Face's
``Conv1D`` (GPT-2's transposed linear).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mpsim.specs.layers import LAYER_KINDS
from mpsim.specs.stack import PlacedLayer
from mpsim.workload.layers import forward_flops_per_sample

FLOP_TOLERANCE = 0.02
ACTIVATIONS = (("GELU", "gelu"), ("SiLU", "silu"), ("Swish", "silu"), ("ReLU", "relu"), ("Tanh", "tanh"))
GATED = {"silu": "swiglu", "gelu": "geglu"}


def _linear(module) -> tuple[int, int, bool] | None:
    """(inputs, outputs, bias) of a linear-like module."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features, module.bias is not None
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and weight is not None and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1]), getattr(module, "bias", None) is not None
    return None


def _norm(module) -> str | None:
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        return "layernorm"
    if "RMSNorm" in type(module).__name__ or (hasattr(nn, "RMSNorm") and isinstance(module, nn.RMSNorm)):
        return "rmsnorm"
    return None


def _activation(module) -> str | None:
    name = type(module).__name__
    return next((op for key, op in ACTIVATIONS if key in name), None)


def _leaves(call) -> list:
    """The calls of modules that call no other module, in order."""
    return [call] if not call.children else [leaf for child in call.children for leaf in _leaves(child)]


def _attribute(call, *names: str) -> Any:
    """The first of ``names`` found on the call's module, its config, or a module above it."""
    while call is not None:
        module = call.module
        for holder in (module, getattr(module, "config", None)):
            for name in names:
                value = getattr(holder, name, None) if holder is not None else None
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        call = call.parent
    return None


def _attention(leaves: list, i: int, width: int) -> tuple[dict[str, Any], int] | None:
    """An attention layer starting at ``leaves[i]``, and the index after its output projection."""
    projections, j = [], i
    while j < len(leaves) and len(projections) < 4:
        dims = _linear(leaves[j].module)
        if dims is not None:
            projections.append((leaves[j], dims))
        elif not isinstance(leaves[j].module, nn.Dropout):
            break
        j += 1
    if len(projections) >= 4 and all(d[0] == width for _, d in projections[:3]) and projections[3][1][1] == width:
        used = 4  # query, key, value, output
    elif len(projections) >= 2 and projections[0][1][0] == width and projections[1][1][1] == width \
            and projections[0][1][1] > width:
        used = 2  # fused query-key-value, output
    else:
        return None
    first, output = projections[0][0], projections[used - 1][0]
    owner = first.parent
    heads = _attribute(owner, "num_heads", "num_attention_heads", "n_head")
    if heads is None:
        return None
    kv_heads = _attribute(owner, "num_key_value_heads") or heads
    head_dim = _attribute(owner, "head_dim", "attention_head_size") or width // heads
    causal = bool(getattr(owner.module, "is_causal", False)) if owner is not None else False
    rope = any("position_embeddings" in (c.kwargs or {}) for c in (owner, owner.parent if owner else None) if c)
    layer = {"kind": "attention", "name": owner.fqn if owner is not None else first.fqn, "num_heads": heads,
             **({"num_kv_heads": kv_heads} if kv_heads != heads else {}),
             **({"head_dim": head_dim} if head_dim != width // heads else {}),
             "causal": causal, "bias": projections[0][1][2], "rope": rope}
    return layer, leaves.index(output) + 1


def _mlp(leaves: list, i: int, width: int) -> tuple[list[dict[str, Any]], int] | None:
    """An MLP starting at ``leaves[i]`` and the index after its down projection."""
    ups, act, j = [], None, i
    while j < len(leaves):
        module = leaves[j].module
        dims = _linear(module)
        if dims is not None and dims[0] == width and dims[1] != width and len(ups) < 2:
            ups.append((leaves[j], dims))
        elif dims is not None and ups and dims[0] == ups[0][1][1] and dims[1] == width and act is not None:
            down = (leaves[j], dims)
            break
        elif _activation(module) is not None and ups and act is None:
            act = _activation(module)
        elif not isinstance(module, nn.Dropout):
            return None
        j += 1
    else:
        return None
    hidden = ups[0][1][1]
    if len(ups) == 2:
        if ups[1][1][1] != hidden or act not in GATED:
            return None
        layers = [{"kind": "linear", "name": ups[0][0].fqn, "out_features": 2 * hidden, "bias": ups[0][1][2]},
                  {"kind": "elementwise", "name": f"{ups[0][0].fqn}.{GATED[act]}", "op": GATED[act]}]
    else:
        layers = [{"kind": "linear", "name": ups[0][0].fqn, "out_features": hidden, "bias": ups[0][1][2]},
                  {"kind": "elementwise", "name": f"{ups[0][0].fqn}.{act}", "op": act}]
    layers.append({"kind": "linear", "name": down[0].fqn, "out_features": width, "bias": down[1][2]})
    return layers, j + 1


def typed_block(call, batch: int) -> dict[str, Any] | None:
    """The ``block`` of typed layers ``call`` is, if it is a transformer block the stack's
    formulas price exactly (see the module docstring); else None."""
    in_shape, out_shape = call.in_shape(batch), call.out_shape(batch)
    if len(in_shape) != 2 or in_shape != out_shape:
        return None
    width = in_shape[1]
    leaves, layers, i, residuals = _leaves(call), [], 0, 0
    while i < len(leaves):
        module = leaves[i].module
        found: Any
        if _norm(module):
            layers.append({"kind": _norm(module), "name": leaves[i].fqn,
                           **({"bias": getattr(module, "bias", None) is not None} if _norm(module) == "layernorm"
                              else {})})
            i += 1
        elif isinstance(module, nn.Dropout):
            if module.p > 0:
                layers.append({"kind": "elementwise", "name": leaves[i].fqn, "op": "dropout", "dropout": module.p})
            i += 1
        elif isinstance(module, nn.MultiheadAttention) and module.embed_dim == width \
                and module._qkv_same_embed_dim and module.batch_first:
            # PyTorch's own attention: one call, projections inside (torchvision's ViT blocks)
            layers.append({"kind": "attention", "name": leaves[i].fqn, "num_heads": module.num_heads,
                           "causal": bool(leaves[i].kwargs.get("is_causal", False)),
                           "bias": module.in_proj_bias is not None,
                           **({"dropout": module.dropout} if module.dropout > 0 else {})})
            i += 1
            residuals += 1
            layers.append({"kind": "elementwise", "name": f"{call.fqn}.residual_{residuals}", "op": "add"})
        elif (found := _attention(leaves, i, width)) is not None:
            layers.append(found[0])
            i = found[1]
            residuals += 1
            layers.append({"kind": "elementwise", "name": f"{call.fqn}.residual_{residuals}", "op": "add"})
        elif (found := _mlp(leaves, i, width)) is not None:
            layers += found[0]
            i = found[1]
            residuals += 1
            layers.append({"kind": "elementwise", "name": f"{call.fqn}.residual_{residuals}", "op": "add"})
        else:
            return None
    if residuals < 2 or not any(layer["kind"] == "attention" for layer in layers):
        return None
    return layers if _prices_the_counted_flops(layers, in_shape, out_shape, call.flops / batch) else None


def _prices_the_counted_flops(layers: list[dict[str, Any]], in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                              counted: float) -> bool:
    shape, flops = in_shape, 0.0
    try:
        for layer in layers:
            spec = LAYER_KINDS[layer["kind"]].model_validate(layer)
            out = tuple(spec.output_shape(shape))
            flops += forward_flops_per_sample(PlacedLayer(spec, "", layer["name"], shape, out))
            shape = out
    except (ValueError, TypeError):
        return False
    return shape == out_shape and abs(flops - counted) <= FLOP_TOLERANCE * max(counted, 1.0)
