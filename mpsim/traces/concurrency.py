"""Which kernels shared the GPU with another stream's kernels, and for how much of their time.

A GPU runs the kernels of different CUDA streams at once: an NCCL collective on its
own stream beside the GEMMs of the compute stream, a copy beside both. Kernels that run
together share the SMs, the L2 cache and the memory bandwidth, so a kernel's duration
in a trace is its time *alone* only when nothing ran beside it. A GEMM of one shape in a
recommendation model's trace takes 8-9 us alone and 9-51 us while a collective runs
(1024 x 512 x 96 on the 8-rank A100 trace in ../shared/traces).

mpsim prices the two apart: a kernel's time alone (the compute model, or a profile
fitted from a trace) and the slowdown of compute beside a collective (the collective's
SMs, ``collective_channels``; ``mpsim/cost/actions.py`` ``overlapped_s``). A check of
predicted kernel times against a trace must therefore know which kernels ran alone and
price the others with that slowdown. This module measures, for each kernel, the share
of its duration during which a kernel of another stream ran, and the share during which
a collective did.

Per stream, the busy time of every *other* stream is merged into disjoint intervals
once; each kernel then sums its overlap with those intervals by binary search.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from mpsim.traces.intervals import merged
from mpsim.traces.model import Kernel


@dataclass(frozen=True)
class Beside:
    """Shares (0-1) of one kernel's duration during which other streams ran kernels."""

    any_kernel: float  # any kernel of another stream (compute, copy or collective)
    collective: float  # an NCCL collective of another stream

    @property
    def alone(self) -> bool:
        return self.any_kernel == 0.0

    @property
    def within_collective(self) -> bool:
        """A collective ran beside it for all of its time (to rounding of the shares)."""
        return self.collective >= 1.0 - 1e-9


def _union(intervals: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Disjoint (starts, ends) covering ``intervals``."""
    disjoint = merged(intervals, -math.inf, math.inf)
    return [start for start, _ in disjoint], [end for _, end in disjoint]


def _covered_s(start: float, end: float, union: tuple[list[float], list[float]]) -> float:
    """Seconds of ``start..end`` inside the disjoint intervals ``union``."""
    starts, ends = union
    index = max(0, bisect.bisect_right(starts, start) - 1)
    covered = 0.0
    while index < len(starts) and starts[index] < end:
        covered += max(0.0, min(end, ends[index]) - max(start, starts[index]))
        index += 1
    return covered


def beside_shares(kernels: tuple[Kernel, ...] | list[Kernel]) -> dict[int, Beside]:
    """For each kernel (keyed by ``id``), the shares of its time beside other streams' kernels.

    ``kernels`` are one device's (one trace's): streams of different devices never share
    a GPU."""
    streams = sorted({kernel.stream for kernel in kernels})
    others_any = {}
    others_collective = {}
    for stream in streams:
        others = [kernel for kernel in kernels if kernel.stream != stream]
        others_any[stream] = _union([(k.start_s, k.end_s) for k in others])
        others_collective[stream] = _union([(k.start_s, k.end_s) for k in others if k.category == "collective"])
    shares: dict[int, Beside] = {}
    for kernel in kernels:
        if kernel.duration_s <= 0:
            shares[id(kernel)] = Beside(0.0, 0.0)
            continue
        any_s = _covered_s(kernel.start_s, kernel.end_s, others_any[kernel.stream])
        collective_s = _covered_s(kernel.start_s, kernel.end_s, others_collective[kernel.stream])
        shares[id(kernel)] = Beside(min(1.0, any_s / kernel.duration_s), min(1.0, collective_s / kernel.duration_s))
    return shares
