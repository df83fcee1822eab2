"""What splitting a backward into input and weight gradients costs in PyTorch.

Zero-bubble schedules (ZB-H1, ZB-V, DualPipe) run a layer's backward as two actions:
``I`` (input gradient, on the critical path) and ``W`` (weight gradient, deferred to
fill a bubble). mpsim prices each from its ops, so ``I + W`` costs what ``B`` costs.
``torch.distributed.pipelining`` computes ``W`` by walking the autograd graph again
from the output gradients ``I`` saved (``stage_backward_weight``: one
``torch.autograd.grad`` per parameter group, then ``grad += dW``), with those saved
gradients and the layer's inputs long out of cache. On a CPU that makes ``W`` 10-15 %
slower than its share of a full backward, enough to move a ZB-V step by several
percent, and no microbenchmark of a single GEMM sees it.

This module measures it on one decoder layer of the job's own model, in the
framework's own functions: a full backward (``B``), and ``I`` then ``W``, alternated
in pairs so a drifting machine speed hits both alike. The ratio

    weight_slowdown = W / (B - I)

(``W`` on its own over ``W``'s share of a full backward) multiplies every ``W``
action's compute in a simulation with the profile (``mpsim/cost/actions.py``), except
on the first pipeline stage: it has no input gradient to produce, so PyTorch runs its
whole backward as its ``W`` and there is nothing split. The ratio is per layer, so
the one-layer measurement holds for chunks of any depth.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from mpsim.calibrate.measure.torch_model import ModelShape, build_chunk

PAIRS = 9  # (B, I then W) pairs per measurement: about a second on one CPU core for the validation model


class SplitBackward:
    """One middle-stage layer of ``shape`` with its gradients kept (they accumulate, as in training)."""

    def __init__(self, shape: ModelShape, device: torch.device, kind: str, seed: int = 0):
        self.chunk = build_chunk(shape, [1, 1, 1], 1, seed, device)  # stage 1 of 3: no embedding, no head
        self.params = list(self.chunk.parameters())
        for param in self.params:
            param.grad = torch.zeros_like(param)
        self.shape, self.device = shape, device
        self.sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
        generator = torch.Generator().manual_seed(seed)
        dtype = self.params[0].dtype
        self.x = torch.randn(1, shape.seq_length, shape.hidden, generator=generator).to(device, dtype)
        self.dy = torch.randn(1, shape.seq_length, shape.hidden, generator=generator).to(device, dtype)

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x.detach().requires_grad_(True)
        y = self.chunk(x)
        self.sync()
        return x, y

    def full_s(self) -> float:
        x, y = self._forward()
        begin = time.perf_counter()
        torch.autograd.backward([y], [self.dy], inputs=[x, *self.params])
        self.sync()
        return time.perf_counter() - begin

    def split_s(self) -> tuple[float, float]:
        x, y = self._forward()
        begin = time.perf_counter()
        _, groups = stage_backward_input([y], [self.dy], [x], iter(self.params))
        self.sync()
        middle = time.perf_counter()
        stage_backward_weight(iter(self.params), groups)
        self.sync()
        return middle - begin, time.perf_counter() - middle

    def measure(self, pairs: int = PAIRS) -> dict:
        """Median seconds of B, I and W over ``pairs`` alternated pairs (after one of each to warm up)."""
        self.full_s()
        self.split_s()
        full, inputs, weights = [], [], []
        for index in range(pairs):
            if index % 2:
                full.append(self.full_s())
            input_s, weight_s = self.split_s()
            inputs.append(input_s)
            weights.append(weight_s)
            if not index % 2:
                full.append(self.full_s())
        return {"full_s": statistics.median(full), "input_s": statistics.median(inputs),
                "weight_s": statistics.median(weights)}
