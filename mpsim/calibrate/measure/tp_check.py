"""Tensor parallelism through DTensor: one MLP block at TP = world size against TP = 1.

The block is FC1 -> GELU -> FC2 on ``[batch, seq, hidden]``. Under TP, FC1 is split by
columns and FC2 by rows with ``ColwiseParallel`` / ``RowwiseParallel``
(``torch.distributed.tensor.parallel``), which is Megatron's split: an all-reduce after
FC2 in the forward pass and one of the input gradient in the backward pass. At TP = 1
every rank runs the whole block on its own, at the same time as the others, so both
settings run with every core busy and differ only in the split.

One iteration is forward plus backward (the input needs a gradient, as a layer's input
does inside a model); the two settings alternate iteration by iteration and the median
over repeats is each one's time.
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
    """Median seconds of one MLP forward+backward at TP = 1 and TP = ``world`` (rank 0's view)."""
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
    mesh = init_device_mesh(kind, (world,))
    torch.manual_seed(config.get("seed", 0))
    split = parallelize_module(Mlp(hidden, ffn, bias).to(device=device, dtype=dtype), mesh,
                               {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    # alternate the two so that a drift in the machine's speed touches both alike
    tp1, tpn = [], []
    for i in range(warmup + repeats):
        single_s, split_s = _iteration_s(single, x, grad, kind), _iteration_s(split, x, grad, kind)
        if i >= warmup:
            tp1.append(single_s)
            tpn.append(split_s)
    # a block's time is its slowest rank's
    both = torch.tensor([tp1, tpn], dtype=torch.float64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    tp1, tpn = both.tolist()
    return {"tp": world, "tp1": summarize(tp1).as_dict(), "tpn": summarize(tpn).as_dict()}
