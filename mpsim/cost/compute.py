"""Seconds for one compute op on one accelerator: a roofline with measured efficiencies.

An op takes the longer of its compute time and its memory time, plus a fixed kernel
overhead. The compute side is not one efficiency number:

* GEMMs reach the device's best measured matmul throughput (its "MAMF") scaled by
  how well the output tiles fill the chip. A GEMM is cut into output tiles that run in
  waves over the SMs; a last, partly filled wave runs at the speed of a full one
  (tile and wave quantization, NVIDIA's *Matrix Multiplication Background* guide).
* Fused attention kernels reach their own published fraction of peak.
* Memory-bound ops (norms, activations, softmax, optimizer) stream at the achieved
  fraction of HBM bandwidth.
"""

from __future__ import annotations

import math
from functools import lru_cache

from mpsim.specs.accelerator import AcceleratorSpec
from mpsim.workload.ops import Op


def wave_efficiency(batch: int, m: int, n: int, tile: tuple[int, int], units: int) -> float:
    """Useful fraction of the tile-waves a GEMM occupies (best of both tile orientations)."""
    best = 0.0
    for tile_m, tile_n in (tile, (tile[1], tile[0])):
        tiles = batch * math.ceil(m / tile_m) * math.ceil(n / tile_n)
        waves = math.ceil(tiles / units)
        best = max(best, batch * m * n / (waves * units * tile_m * tile_n))
    return best


class ComputeModel:
    """Prices compute ops for one accelerator and compute dtype."""

    def __init__(self, accelerator: AcceleratorSpec, dtype: str, calibration=None):
        self.accelerator = accelerator
        self.dtype = dtype
        eff = accelerator.efficiency
        self.peak_flops = accelerator.peak(dtype)
        self.gemm_flops = self.peak_flops * eff.gemm
        self.memory_bandwidth = accelerator.memory.bandwidth * eff.memory
        self.overhead_s = eff.kernel_overhead
        # measured seconds per op (mpsim/cost/calibrated.py CalibratedCosts) replace the roofline
        # below; its streaming bandwidth prices what uses memory_bandwidth (the optimizer step)
        self.calibration = calibration
        if calibration is not None:
            self.memory_bandwidth = calibration.stream_bandwidth
        self.time = lru_cache(maxsize=None)(self._time)

    def _time(self, op: Op) -> float:
        if self.calibration is not None:
            return self.calibration.op_seconds(op)
        memory_s = op.bytes / self.memory_bandwidth
        if op.kind == "gemm":
            assert op.shape is not None
            batch, m, n, _ = op.shape
            eff = self.accelerator.efficiency
            compute_s = op.flops / (self.gemm_flops * wave_efficiency(batch, m, n, eff.gemm_tile,
                                                                     self.accelerator.compute_units))
        elif op.kind == "attention":
            eff = self.accelerator.efficiency
            fraction = eff.attention_forward if op.direction == "forward" else eff.attention_backward
            compute_s = op.flops / (self.peak_flops * fraction)
        elif op.kind == "memory":
            compute_s = 0.0
        else:
            raise ValueError(f"{op.name} is a {op.kind}, not a compute op")
        return max(compute_s, memory_s) + self.overhead_s
