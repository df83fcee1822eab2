"""``mpsim import-torch``: a PyTorch model as a layer-stack model file.

The user's factory (``path/to/file.py:function`` or ``package.module:function``) builds
the model on the meta device, so no weights are allocated; one forward pass of a meta
batch records which modules run, in order, with their input and output shapes and the
FLOPs PyTorch's own counter (``torch.utils.flop_counter.FlopCounterMode``) attributes
to them. The pipeline units are the modules the model's ``forward`` calls directly
(``nn.Sequential`` containers opened up, a wrapper with a single child looked through).
Each becomes one layer of the stack:

* a module of a known kind (``nn.Linear``, ``nn.Conv1d/2d``, ``nn.LSTM/GRU/RNN``,
  norms, ``nn.Embedding``, pooling, activations, dropout, ``nn.Flatten``) becomes that
  kind with its shape, so tensor parallelism can split it, provided the stack's formula
  gives the counter's FLOPs;
* a transformer block whose modules read as norm, attention and MLP layers (a Hugging
  Face decoder or encoder block; ``blocks.py``) becomes a ``block`` of those layers, which
  tensor parallelism splits by heads and by the MLP's width;
* anything else (``nn.MultiheadAttention``, a block of another shape) becomes a
  ``custom`` layer with measured costs: forward FLOPs, backward FLOPs and their
  weight-gradient share (from the autograd pass on meta tensors), HBM traffic (the bytes
  of every ATen op's inputs and outputs, an upper bound for fused kernels), the tensors
  autograd saves for the backward, and the parameters;
* work the model's ``forward`` does between units (reshapes, adding a position table,
  averaging tokens) becomes a ``view`` when it is free, else a ``custom`` layer.

Bytes are scaled from the meta model's dtype to the 2-byte activations of bf16 training.
This runs the user's code: it happens only when asked, and the stack it writes is plain
data that simulates without PyTorch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from mpsim.errors import InputError
from mpsim.torchio import require_torch
from mpsim.torchio.blocks import typed_block
from mpsim.torchio.measure import Call, glue_layer, measure_custom, trace_calls, typed_layer

ACT_BYTES = 2  # bf16 activations


def load_factory(spec: str, base_dir: Path | None = None):
    """The callable named by ``file.py:function`` or ``package.module:function``."""
    if ":" not in spec:
        raise InputError("expected FILE.py:FUNCTION or MODULE:FUNCTION, e.g. examples/cnn_transformer.py:build",
                         spec)
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where)
        if base_dir is not None and not path.is_absolute() and not path.is_file():
            path = base_dir / path
        if not path.is_file():
            raise InputError("factory file not found", where)
        module_name = f"mpsim_user_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        try:
            loader.loader.exec_module(module)
        except Exception as exc:  # the user's file: report its error on one line
            raise InputError(f"importing it failed: {type(exc).__name__}: {exc}", where) from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise InputError(f"cannot import module {where!r}: {exc}", spec) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InputError(f"has no function {name!r}", where)
    return factory


def _build(factory, spec: str):
    torch = require_torch()
    try:
        with torch.device("meta"):
            model = factory()
    except Exception as exc:
        raise InputError(f"calling the factory failed: {type(exc).__name__}: {exc}", spec) from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"the factory returned {type(model).__name__}, not a torch.nn.Module", spec)
    return model


def import_model(spec: str, input_shape: tuple[int, ...], *, name: str | None = None, token_ids: bool = False,
                 loss: str = "cross_entropy", batch: int = 3, base_dir: Path | None = None) -> dict[str, Any]:
    """The layer-stack mapping of the model ``spec`` builds, for one sample of ``input_shape``.

    ``batch`` is the meta batch traced (any size: costs are per sample); an odd size keeps
    it from being mistaken for another dimension of size 2.
    """
    torch = require_torch()
    model = _build(load_factory(spec, base_dir), spec)
    model.train()
    with torch.device("meta"):
        sample = torch.zeros((batch, *input_shape), dtype=torch.long) if token_ids else \
            torch.empty((batch, *input_shape))
    try:
        units, glue, _ = trace_calls(model, sample)
    except Exception as exc:
        raise InputError(f"the forward pass on meta tensors failed: {type(exc).__name__}: {exc}", spec) from None
    # measured bytes are at the meta model's dtype (fp32 floats, int64 ids); training keeps bf16
    scale = ACT_BYTES / (4 if token_ids else sample.element_size())
    extra = _unowned_parameters(model, units)  # a class token, a position table the model adds itself
    layers: list[dict[str, Any]] = []
    for index, call in enumerate(units):
        if glue[index] is not None:
            layers.append(glue_layer(glue[index], f"between_{index}", batch, scale, params=extra))
            extra = 0 if layers[-1]["kind"] == "custom" else extra
        layers.append(typed_layer(call, batch, first=not layers) or _block(call, batch)
                      or measure_custom(call, batch, scale))
    if glue[-1] is not None:
        layers.append(glue_layer(glue[-1], "after_last", batch, scale))
    if extra:  # no glue step to hold them: a zero-cost layer after the first keeps the count right
        layers.insert(1, {"kind": "custom", "name": "model_parameters", "forward_flops": 0.0, "bytes": 0.0,
                          "params": extra})
    if token_ids:
        _check_takes_token_ids(layers)
    # a measured layer has no known split: under tensor parallelism it runs whole on every
    # rank, as a framework runs the modules it does not shard
    layers = [{"kind": "custom", "name": layer["name"], "tp": "replicate",
               **{k: v for k, v in layer.items() if k not in ("kind", "name")}} if layer["kind"] == "custom" else layer
              for layer in layers]
    if loss == "cross_entropy":
        loss_layer = {"kind": "cross_entropy", "name": "loss"}
        if layers and layers[-1]["kind"] == "linear":
            # the output projection and the loss stay in one unit, as in every framework: under
            # tensor parallelism the projection splits the classes and the loss reads them split
            head = layers.pop()
            layers.append({"kind": "block", "name": f"{head['name']}_and_loss", "layers": [head, loss_layer]})
        else:
            layers.append(loss_layer)
    stem = spec.rsplit(":", 1)[0].replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    return {
        "kind": "stack",
        "name": name or stem,
        "description": f"imported from {spec} with input shape {list(input_shape)} by mpsim import-torch "
                       f"(torch {torch.__version__.split('+')[0]}); costs per sample, bf16 activations",
        "input_shape": list(input_shape),
        **({"tokens_per_sample": int(input_shape[-1])} if token_ids else {}),
        "layers": layers,
    }


def _check_takes_token_ids(layers: list[dict[str, Any]]) -> None:
    """Token ids go into an embedding: a model whose first layer is a typed layer of another
    kind (a Linear, a convolution) takes numbers, and would be costed as if it did (meta
    tensors run a Linear on integer ids without complaint). A measured module may hold its
    embedding inside, so it passes."""
    first = layers[0] if layers else None
    while first is not None and first["kind"] == "block" and first.get("layers"):
        first = first["layers"][0]
    if first is not None and first["kind"] not in ("embedding", "custom"):
        raise InputError(f"the model's first layer {first['name']!r} is a {first['kind']} layer, which takes numbers, "
                         f"not token ids (an embedding takes them); leave --token-ids out", "--token-ids")


def _block(call: Call, batch: int) -> dict[str, Any] | None:
    """A transformer block as a ``block`` of typed layers (``blocks.py``), or None."""
    layers = typed_block(call, batch)
    return None if layers is None else {"kind": "block", "name": call.fqn or type(call.module).__name__,
                                        "layers": layers}


def _unowned_parameters(model, units: list[Call]) -> int:
    """Parameters of the model that no unit module owns."""
    inside = {id(p) for call in units for p in call.module.parameters()}
    return int(sum(p.numel() for p in model.parameters() if id(p) not in inside))
