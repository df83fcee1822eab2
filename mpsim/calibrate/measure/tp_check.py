"""Tensor parallelism: one MLP block at TP = world size against TP = 1.

The block is FC1 -> GELU -> FC2 on ``[batch, seq, hidden]``, split the Megatron way:
FC1 by columns, FC2 by rows, an all-reduce of the output after FC2 in the forward pass
and one of the input gradient in the backward pass. That split runs twice:

* **written out** (:class:`MegatronMlp`): each rank holds its shards as plain
  ``nn.Linear`` layers and two autograd functions place the all-reduces, as
  Megatron-LM's column- and row-parallel layers do. This is exactly the work mpsim
  prices for a TP layer (the GEMMs at the per-rank shapes, the activation, two
  all-reduces), and the speed-up the check compares with mpsim's;
* **through DTensor** (``ColwiseParallel`` / ``RowwiseParallel`` of
  ``torch.distributed.tensor.parallel``): the same split, plus whatever DTensor adds on
  top of it (ops dispatched through a Python tensor subclass, conversions between
  local tensors and DTensors). It is reported beside the check, so that a gap between
  mpsim and DTensor can be told apart into mpsim's model (the written-out split) and
  DTensor's own cost, which mpsim does not model (its TP is Megatron's).

At TP = 1 every rank runs the whole block on its own, at the same time as the others,
so every setting runs with every core busy and they differ only in the split.

One iteration is forward plus backward (the input needs a gradient, as a layer's input
does inside a model); the three settings alternate iteration by iteration and the
median over repeats is each one's time.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mpsim.calibrate.measure.timing import summarize
from mpsim.calibrate.measure.torch_model import TORCH_DTYPES


class Mlp(nn.Module):
    """FC1 -> GELU -> FC2."""

    def __init__(self, hidden: int, ffn_hidden: int, bias: bool):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden, bias=bias)
        self.fc2 = nn.Linear(ffn_hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _CopyToTensorParallel(torch.autograd.Function):
    """The input of a column-parallel layer: the same on every rank forward, all-reduced backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTensorParallel(torch.autograd.Function):
    """The output of a row-parallel layer: partial sums all-reduced forward, the same gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class MegatronMlp(nn.Module):
    """This rank's shards of :class:`Mlp` split over ``world`` ranks, the all-reduces written out.

    FC1 keeps rows ``rank`` of its weight and bias (columns of its output), FC2 the
    matching columns of its weight; FC2's bias is added once, after the all-reduce.
    """

    def __init__(self, whole: Mlp, rank: int, world: int):
        super().__init__()
        ffn, hidden = whole.fc1.weight.shape
        part = ffn // world
        rows = slice(rank * part, (rank + 1) * part)
        bias = whole.fc1.bias is not None
        self.fc1 = nn.Linear(hidden, part, bias=bias)
        self.fc2 = nn.Linear(part, hidden, bias=False)
        self.fc2_bias = nn.Parameter(whole.fc2.bias.detach().clone()) if bias else None
        with torch.no_grad():
            self.fc1.weight.copy_(whole.fc1.weight[rows])
            if bias:
                self.fc1.bias.copy_(whole.fc1.bias[rows])
            self.fc2.weight.copy_(whole.fc2.weight[:, rows])
        self.to(device=whole.fc1.weight.device, dtype=whole.fc1.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _ReduceFromTensorParallel.apply(self.fc2(F.gelu(self.fc1(_CopyToTensorParallel.apply(x)))))
        return out if self.fc2_bias is None else out + self.fc2_bias


def _iteration_s(block: nn.Module, x: torch.Tensor, grad: torch.Tensor, kind: str) -> float:
    """Seconds of one forward+backward of ``block`` after a barrier."""
    dist.barrier()
    if kind == "cuda":
        torch.cuda.synchronize()
    x.grad = None
    begin = time.perf_counter()
    out = block(x)
    out.backward(grad)
    # DTensor's collectives can return before they finish (the result waits when first
    # used): touching the input gradient makes the iteration include its all-reduce
    x.grad.sum().item()
    if kind == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - begin


def run_tp_check(config: dict, rank: int, world: int, device: torch.device, kind: str) -> dict:
    """Median seconds of one MLP forward+backward at TP = 1, at TP = ``world`` written out, and through DTensor.

    ``tpn`` is the written-out split (what mpsim models), ``dtensor`` the same split
    through DTensor; each time is the slowest rank's.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    hidden, ffn, bias = config["hidden"], config["ffn_hidden"], config["bias"]
    shape = (config["batch"], config["seq"], hidden)
    warmup, repeats = config.get("warmup", 3), config.get("repeats", 15)
    dtype = TORCH_DTYPES[config.get("dtype", "fp32")]
    torch.manual_seed(config.get("seed", 0))
    x = torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(*shape, device=device, dtype=dtype)
    single = Mlp(hidden, ffn, bias).to(device=device, dtype=dtype)
    written_out = MegatronMlp(single, rank, world)
    mesh = init_device_mesh(kind, (world,))
    torch.manual_seed(config.get("seed", 0))
    dtensor = parallelize_module(Mlp(hidden, ffn, bias).to(device=device, dtype=dtype), mesh,
                                 {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    # alternate the settings so that a drift in the machine's speed touches all alike
    blocks = (single, written_out, dtensor)
    times: list[list[float]] = [[] for _ in blocks]
    for i in range(warmup + repeats):
        for block, kept in zip(blocks, times):
            seconds = _iteration_s(block, x, grad, kind)
            if i >= warmup:
                kept.append(seconds)
    # a block's time is its slowest rank's
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    tp1, tpn, through_dtensor = slowest.tolist()
    return {"tp": world, "tp1": summarize(tp1).as_dict(), "tpn": summarize(tpn).as_dict(),
            "dtensor": summarize(through_dtensor).as_dict()}
