"""Tracing a PyTorch model on the meta device: which modules run, their shapes, FLOPs and bytes.

Forward hooks on every module record each call (its inputs and outputs, and the running
totals of PyTorch's FLOP counter and of :class:`ByteCounter` before and after it); the
calls form a tree. :func:`trace_calls` picks the pipeline units from that tree and the
work done between them. :func:`typed_layer` turns a unit of a known module type into a
layer of that kind when the stack's formula reproduces the counted FLOPs;
:func:`measure_custom` re-runs any other unit on fresh meta tensors to measure its
forward and backward FLOPs, the weight-gradient share, its bytes and what autograd saves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpsim.specs.layers import LAYER_KINDS
from mpsim.specs.stack import PlacedLayer
from mpsim.torchio import require_torch
from mpsim.workload.layers import forward_flops_per_sample

torch = require_torch()
nn = torch.nn
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

FLOP_TOLERANCE = 0.02  # a known module keeps its kind only if the stack's formula is this close to the counter


class ByteCounter(TorchDispatchMode):
    """Bytes of every ATen op's tensor inputs and outputs (views are free): HBM traffic without fusion."""

    def __init__(self):
        super().__init__()
        self.bytes = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            self.bytes += sum(_tensor_bytes(t) for t in _tensors((args, kwargs, out)))
        return out


def _tensors(obj: Any) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []


def _tensor_bytes(t) -> float:
    return float(t.numel() * t.element_size())


@dataclass(eq=False)
class Call:
    """One forward call of a module during the trace."""

    module: Any
    fqn: str
    args: tuple
    kwargs: dict
    parent: "Call | None"
    flops_before: float
    bytes_before: float
    output: Any = None
    flops_after: float = 0.0
    bytes_after: float = 0.0
    children: list["Call"] = field(default_factory=list)

    @property
    def flops(self) -> float:
        return self.flops_after - self.flops_before

    def in_shape(self, batch: int) -> tuple[int, ...]:
        # the first tensor passed, positionally or by keyword (Hugging Face models pass
        # input_ids= and hidden_states= by name)
        tensors = _tensors(self.args) or _tensors(self.kwargs)
        return sample_shape(tensors[0], batch) if tensors else ()

    def out_shape(self, batch: int) -> tuple[int, ...]:
        tensors = _tensors(self.output)
        return sample_shape(tensors[0], batch) if tensors else ()


@dataclass
class Glue:
    """Work the model's own ``forward`` does between two units."""

    flops: float
    bytes: float
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


def sample_shape(t, batch: int) -> tuple[int, ...]:
    """A tensor's shape without its batch dimension (first, or second for sequence-first RNN tensors)."""
    shape = tuple(t.shape)
    if shape and shape[0] == batch:
        return shape[1:]
    if len(shape) >= 2 and shape[1] == batch:
        return (shape[0], *shape[2:])
    return shape


def trace_calls(model, sample) -> tuple[list[Call], list[Glue | None], tuple[int, ...]]:
    """(pipeline units, the glue before each unit and after the last, the model's per-sample output shape)."""
    batch = sample.shape[0]
    names = {id(module): name for name, module in model.named_modules()}
    calls: list[Call] = []
    active: list[Call] = []
    counter = FlopCounterMode(display=False)
    traffic = ByteCounter()

    def before(module, args, kwargs):
        call = Call(module, names.get(id(module), ""), args, kwargs, active[-1] if active else None,
                    counter.get_total_flops(), traffic.bytes)
        if call.parent is not None:
            call.parent.children.append(call)
        calls.append(call)
        active.append(call)

    def after(module, args, kwargs, output):
        call = active.pop()
        call.output, call.flops_after, call.bytes_after = output, counter.get_total_flops(), traffic.bytes

    handles = [h for module in model.modules() for h in (
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True))]
    try:
        with counter, traffic:
            model(sample)
    finally:
        for handle in handles:
            handle.remove()
    root = calls[0]
    level, units = root, _expand(root)
    while len(units) == 1 and units[0].children:  # a wrapper around one model: look inside
        level, units = units[0], _expand(units[0])
    if not units:
        units = [level]
        level = None  # type: ignore[assignment]
    return units, _glue(level, units, batch), root.out_shape(batch)


def _expand(call: Call) -> list[Call]:
    """The calls a module makes, with ``nn.Sequential`` containers and backbones opened up.

    A backbone is a module that runs a stack of repeated blocks from an ``nn.ModuleList``
    (a Hugging Face ``LlamaModel``, ``GPT2Model`` or ``BertEncoder``, a timm ViT's blocks):
    its blocks become the units, one per block, so the stack can be cut between any two.
    """
    out: list[Call] = []
    for child in call.children:
        out += _expand(child) if isinstance(child.module, nn.Sequential) or _runs_block_stack(child) else [child]
    return out


BLOCK_CONTAINERS = (nn.ModuleList, nn.Sequential)


def _runs_block_stack(call: Call) -> bool:
    """Whether ``call`` (or a module it calls) runs two or more blocks of one class held in an
    ``nn.ModuleList`` or ``nn.Sequential`` (torchvision's ViT keeps its encoder blocks in one)."""
    # blocks are modules built of modules: two linear layers in a Sequential are not a stack
    listed = {id(block): type(block) for module in call.module.modules() if isinstance(module, BLOCK_CONTAINERS)
              for block in module if next(block.children(), None) is not None}
    kinds = [listed[id(child.module)] for child in call.children if id(child.module) in listed]
    return any(kinds.count(kind) >= 2 for kind in set(kinds)) or any(
        _runs_block_stack(child) for child in call.children if not isinstance(child.module, nn.ModuleList)
        and any(isinstance(m, BLOCK_CONTAINERS) for m in child.module.modules()))


def _glue(level: Call | None, units: list[Call], batch: int) -> list[Glue | None]:
    """What ``level`` computes itself before each unit and after the last."""
    if level is None:
        return [None] * (len(units) + 1)
    marks = [(level.flops_before, level.bytes_before, level.in_shape(batch))]
    marks += [(u.flops_after, u.bytes_after, u.out_shape(batch)) for u in units]
    ends = [(u.flops_before, u.bytes_before, u.in_shape(batch)) for u in units]
    ends.append((level.flops_after, level.bytes_after, level.out_shape(batch)))
    glue: list[Glue | None] = []
    for (f0, b0, s0), (f1, b1, s1) in zip(marks, ends):
        if f1 - f0 <= 0 and b1 - b0 <= 0 and s0 == s1:
            glue.append(None)
        else:
            glue.append(Glue(max(0.0, f1 - f0), max(0.0, b1 - b0), s0, s1))
    return glue


def glue_layer(glue: Glue, name: str, batch: int, scale: float, params: int = 0) -> dict[str, Any]:
    """A free reshape as a ``view``; anything that computes or moves bytes as a ``custom`` layer."""
    free = glue.flops == 0 and glue.bytes == 0 and not params
    if free and _numel(glue.in_shape) == _numel(glue.out_shape):
        return {"kind": "view", "name": name, "shape": list(glue.out_shape)}
    return {"kind": "custom", "name": name, "forward_flops": glue.flops / batch, "bytes": glue.bytes * scale / batch,
            "params": params, "output_shape": list(glue.out_shape)}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def typed_layer(call: Call, batch: int, first: bool) -> dict[str, Any] | None:
    """The layer of a known module type, if its kind's formula gives the counted FLOPs; else None."""
    module, in_shape, out_shape = call.module, call.in_shape(batch), call.out_shape(batch)
    layer = _describe(module, in_shape, first)
    if layer is None:
        return None
    layer = {"kind": layer.pop("kind"), "name": call.fqn or type(module).__name__, **layer}
    try:
        spec = LAYER_KINDS[layer["kind"]].model_validate(layer)
        if tuple(spec.output_shape(in_shape)) != out_shape:
            return None
    except (ValueError, TypeError):
        return None
    mine = forward_flops_per_sample(PlacedLayer(spec, "", layer["name"], in_shape, out_shape))
    measured = call.flops / batch
    if abs(mine - measured) > FLOP_TOLERANCE * max(measured, 1.0):
        return None
    return layer


def _describe(module, in_shape: tuple[int, ...], first: bool) -> dict[str, Any] | None:
    """Kind and shape fields of a module PyTorch ships, or None."""
    if isinstance(module, nn.Linear):
        return {"kind": "linear", "out_features": module.out_features, "bias": module.bias is not None}
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        padding = module.padding if isinstance(module.padding, str) else list(module.padding)
        return {"kind": "conv1d" if isinstance(module, nn.Conv1d) else "conv2d", "out_channels": module.out_channels,
                "kernel_size": list(module.kernel_size), "stride": list(module.stride), "padding": padding,
                "dilation": list(module.dilation), "groups": module.groups, "bias": module.bias is not None}
    if isinstance(module, (nn.LSTM, nn.GRU, nn.RNN)) and not getattr(module, "proj_size", 0):
        if isinstance(module, nn.RNN) and module.nonlinearity != "tanh":
            pass  # a ReLU RNN costs the same
        return {"kind": {nn.LSTM: "lstm", nn.GRU: "gru", nn.RNN: "rnn"}[type(module)],
                "hidden_size": module.hidden_size, "num_layers": module.num_layers,
                "bidirectional": module.bidirectional, "bias": module.bias}
    if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1:
        return {"kind": "layernorm", "bias": module.bias is not None}
    if hasattr(nn, "RMSNorm") and isinstance(module, nn.RMSNorm):
        return {"kind": "rmsnorm"}
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return {"kind": "batchnorm", "channel_dim": 0 if len(in_shape) > 1 else -1}
    if isinstance(module, nn.GroupNorm):
        return {"kind": "groupnorm", "num_groups": module.num_groups}
    if isinstance(module, nn.Embedding) and first:
        return {"kind": "embedding", "num_embeddings": module.num_embeddings, "embedding_dim": module.embedding_dim}
    activations = {nn.GELU: "gelu", nn.ReLU: "relu", nn.SiLU: "silu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid",
                   nn.Hardtanh: "hardtanh"}
    if type(module) in activations:
        return {"kind": "elementwise", "op": activations[type(module)]}
    if isinstance(module, nn.Dropout):
        return {"kind": "elementwise", "op": "dropout", "dropout": module.p}
    if isinstance(module, (nn.AvgPool1d, nn.AvgPool2d, nn.MaxPool1d, nn.MaxPool2d)):
        return {"kind": "pool", "mode": "avg" if "Avg" in type(module).__name__ else "max",
                "kernel_size": _ints(module.kernel_size), "stride": _ints(module.stride),
                "padding": _ints(module.padding)}
    if isinstance(module, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)) and module.output_size in (1, (1, 1)):
        return {"kind": "pool", "mode": "avg"}
    return None


def _ints(value) -> int | list[int]:
    return value if isinstance(value, int) else list(value)


def _fresh(obj: Any) -> Any:
    """The same structure with new meta tensors (leaves needing a gradient where the originals did)."""
    if isinstance(obj, torch.Tensor):
        t = torch.empty(obj.shape, dtype=obj.dtype, device="meta")
        return t.requires_grad_(obj.requires_grad and obj.is_floating_point())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fresh(item) for item in obj)
    if isinstance(obj, dict):
        return {key: _fresh(value) for key, value in obj.items()}
    return obj


def measure_custom(call: Call, batch: int, scale: float) -> dict[str, Any]:
    """A unit of no known kind, measured: forward and backward FLOPs, bytes, saved tensors, parameters."""
    module = call.module
    args, kwargs = _fresh(call.args), _fresh(call.kwargs)
    params = [p for p in module.parameters() if p.requires_grad]
    param_ids = {id(p) for p in module.parameters()}
    saved: dict[int, float] = {}

    def pack(t):
        base = t._base if t._base is not None else t
        if id(t) not in param_ids and id(base) not in param_ids:
            saved[id(base)] = _tensor_bytes(base)
        return t

    forward, traffic = FlopCounterMode(display=False), ByteCounter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), forward, traffic:
        output = module(*args, **kwargs)
    outputs = [t for t in _tensors(output) if t.requires_grad]
    inputs = [t for t in _tensors((args, kwargs)) if t.requires_grad]
    backward_flops = input_flops = 0.0
    if outputs:
        grads = [torch.ones_like(t) for t in outputs]
        if inputs:
            with FlopCounterMode(display=False) as counter:
                torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)
            input_flops = counter.get_total_flops()
        if inputs or params:
            with FlopCounterMode(display=False) as counter:
                torch.autograd.grad(outputs, inputs + params, grads, allow_unused=True)
            backward_flops = counter.get_total_flops()
    weight_share = (backward_flops - input_flops) / backward_flops if backward_flops > 0 else 0.0
    return {"kind": "custom", "name": call.fqn or type(module).__name__,
            "forward_flops": forward.get_total_flops() / batch, "backward_flops": backward_flops / batch,
            "weight_grad_fraction": round(min(1.0, max(0.0, weight_share)), 6),
            "bytes": traffic.bytes * scale / batch, "params": int(sum(p.numel() for p in module.parameters())),
            "activation_bytes": sum(saved.values()) * scale / batch, "output_shape": list(call.out_shape(batch))}
