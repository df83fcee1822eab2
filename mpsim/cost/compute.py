"""Seconds for one compute op on one accelerator: a roofline with measured efficiencies.

An op takes the longer of its compute time and its memory time, plus a fixed kernel
overhead. The compute side is not one efficiency number:

* GEMMs reach the device's best measured matmul throughput (its "MAMF") scaled by
  how well the output tiles fill the chip and how long each tile computes between its
  fixed phases. A GEMM is cut into output tiles that run in waves over the SMs; a last,
  partly filled wave runs at the speed of a full one (tile and wave quantization,
  NVIDIA's *Matrix Multiplication Background* guide). Each tile then walks K in steps of
  ``gemm_tile_k``: before its first step it loads one step's operand tiles, after its
  last it writes its output tile (and reads it first when it accumulates), and during
  both the SM's tensor cores wait (:func:`tile_fill_efficiency`). A GEMM with a short K,
  as tensor parallelism makes them, spends a larger share of its time there. A GEMM with
  fewer output tiles than SMs may also split K (:func:`split_k_choices`), paying a
  reduction of fp32 partial sums; the fastest split is taken.
* Fused attention kernels run at their published rate: where the accelerator carries a
  sweep of the kernel over sequence lengths (``efficiency.attention_sweep``), the rate at
  the keys per query one kernel call sees and at its head size, masked and unmasked work
  priced apart (short calls fill the SMs poorly and pay each query block's fixed load and
  store over fewer key blocks; a causal mask adds partly masked diagonal blocks; small
  heads do less work per loaded block); else one fraction of peak per pass.
* Both are measured by short benchmarks, which find the GPU cool and at its top clock; a
  training step keeps it at its power limit, where it holds a lower clock. GEMMs run at
  ``efficiency.sustained_compute`` of the benchmarks' rate, fp8 GEMMs at
  ``sustained_compute_fp8`` and fused attention at ``sustained_attention`` (measured: the
  same kernels as short bursts and after a minute of their own load; each kind draws its
  own power, so each holds its own clock).
* Memory-bound ops (norms, activations, softmax, optimizer) stream at the achieved
  fraction of HBM bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from mpsim.errors import InputError
from mpsim.specs.accelerator import BYTES_PER_ELEMENT, AcceleratorSpec
from mpsim.workload.ops import Op

# bytes of one partial sum a split-K GEMM stores for its reduction (fp32 accumulators)
PARTIAL_SUM_BYTES = 4


def output_tiles(batch: int, m: int, n: int, tile: tuple[int, int]) -> tuple[int, int]:
    """Output tiles of a GEMM in each orientation of the tile."""
    return tuple(batch * math.ceil(m / tile_m) * math.ceil(n / tile_n)  # type: ignore[return-value]
                 for tile_m, tile_n in (tile, (tile[1], tile[0])))


def tile_waves(batch: int, m: int, n: int, tile: tuple[int, int], units: int, splits: int = 1) -> int:
    """Waves of output tiles over ``units`` (best of both tile orientations), each tile cut ``splits``
    ways along K."""
    return min(math.ceil(tiles * splits / units) for tiles in output_tiles(batch, m, n, tile))


def split_k_choices(batch: int, m: int, n: int, k: int, tile: tuple[int, int], tile_k: int | None,
                    units: int) -> tuple[int, ...]:
    """The K splits worth pricing: 1, and where the output tiles leave part of one wave idle,
    powers of two up to the split that fills it, each split at least one K step deep.

    With fewer output tiles than compute units a library cuts K too (cuBLAS's split-K and
    its ``splitKreduce`` kernel, CUTLASS's split-K and stream-K), so that every unit works
    and a reduction sums the partial products; with a wave or more of tiles it does not.
    """
    tiles = min(output_tiles(batch, m, n, tile))
    choices = [1]
    step = tile_k or 1
    while tiles * choices[-1] * 2 <= units and k >= choices[-1] * 2 * step:
        choices.append(choices[-1] * 2)
    return tuple(choices)


def tile_fill_efficiency(k: int, tile: tuple[int, int], tile_k: int, operand_bytes: int, epilogue_bytes: int,
                         unit_flops: float, unit_bandwidth: float, epilogue_overlap: bool = False) -> float:
    """Share of a tile's time its tensor cores compute: main-loop steps over steps plus the fixed phases.

    One step multiplies a (rows x tile_k) by a (tile_k x cols) block at the SM's share of
    the matmul rate; the load before the first step moves one step's operand blocks and
    the store after the last moves the output tile, both at the SM's share of the
    achieved memory bandwidth, since every SM of a wave loads and stores in the same
    phase. K is padded to whole steps. With ``epilogue_overlap`` (Hopper's warp-specialized
    kernels: one warp group stores its tile while another computes) the store is hidden.
    """
    rows, cols = tile
    steps = math.ceil(k / tile_k)
    step_s = 2.0 * rows * cols * tile_k / unit_flops
    load_s = (rows + cols) * tile_k * operand_bytes / unit_bandwidth
    store_s = 0.0 if epilogue_overlap else rows * cols * epilogue_bytes / unit_bandwidth
    useful_s = 2.0 * rows * cols * k / unit_flops
    return useful_s / (steps * step_s + load_s + store_s)


class ComputeModel:
    """Prices compute ops for one accelerator and compute dtype."""

    def __init__(self, accelerator: AcceleratorSpec, dtype: str, calibration=None,
                 attention_kernel: str | None = None):
        self.accelerator = accelerator
        self.dtype = dtype
        eff = accelerator.efficiency
        # the fused attention kernel the run calls (training.attention_kernel; None: the file's default)
        self.attention_sweep = eff.attention_kernel(attention_kernel)
        if attention_kernel is not None and self.attention_sweep is None:
            raise InputError(f"{accelerator.name} has no measured sweep of attention kernel {attention_kernel!r}",
                             field="training.attention_kernel")
        self.peak_flops = accelerator.peak(dtype)
        self.gemm_flops = self._gemm_flops(dtype)
        self.memory_bandwidth = accelerator.memory.bandwidth * eff.memory
        self.overhead_s = eff.kernel_overhead
        # measured seconds per op (mpsim/cost/calibrated.py CalibratedCosts) replace the roofline
        # below; its streaming bandwidth prices what uses memory_bandwidth (the optimizer step)
        self.calibration = calibration
        if calibration is not None:
            self.memory_bandwidth = calibration.stream_bandwidth
        self._sustained_attention = eff.sustained_attention or eff.sustained_compute
        self.time = lru_cache(maxsize=None)(self._time)

    def _gemm_flops(self, dtype: str) -> float:
        """Best measured matmul rate in ``dtype``, held under continuous load."""
        eff = self.accelerator.efficiency
        fraction = eff.gemm_fp8 if dtype == "fp8" and eff.gemm_fp8 is not None else eff.gemm
        sustained = eff.sustained_compute_fp8 if dtype == "fp8" and eff.sustained_compute_fp8 is not None \
            else eff.sustained_compute
        return self.accelerator.peak(dtype) * fraction * sustained

    def _attention_s(self, op: Op, dtype: str) -> float:
        """Compute seconds of a fused attention op: the published sweep's rate at the length
        each kernel call sees, its masked and unmasked shares priced apart; else one fraction."""
        eff = self.accelerator.efficiency
        backward = op.direction != "forward"
        sweep = self.attention_sweep
        # fp8 inputs run at the kernel's measured fp8 rates, and where it has none (no fp8 series,
        # or a mask or length they do not cover) at its bf16 ones: where fp8 attention was measured
        # (cuDNN on H200, GB200, B200) it runs 0.64x (Hopper's causal backward at 32k tokens) to
        # 1.5x the bf16 rate, never the fp8 peak's 2x
        fp8 = dtype == "fp8" and "bf16" in self.accelerator.peak_flops
        base = "bf16" if fp8 else dtype
        fixed_rate = self.accelerator.peak(base) * (eff.attention_backward if backward else eff.attention_forward)
        if sweep is None or op.kernel_seq <= 0 or base not in ("bf16", "fp16"):
            return op.flops / (fixed_rate * self._sustained_attention)
        seconds = 0.0
        # the masked and unmasked shares apart; a share the sweep did not measure (a source that
        # measured a causal mask only) at the part's single fraction
        for causal, flops in ((True, op.flops * op.causal_share), (False, op.flops * (1.0 - op.causal_share))):
            if not flops:
                continue
            measured_fp8 = fp8 and sweep.covers(causal, fp8=True)
            if not measured_fp8 and not sweep.covers(causal):
                seconds += flops / fixed_rate
                continue
            lengths = (op.kernel_seq, op.unmasked_seq) if op.unmasked_seq and not causal else (op.kernel_seq,)
            seconds += flops / min(sweep.rate(seq, backward, causal, head_dim=op.head_dim, fp8=measured_fp8)
                                   for seq in lengths)
        return seconds / self._sustained_attention

    def _split_gemm_s(self, op: Op, batch: int, m: int, n: int, k: int, splits: int, gemm_flops: float,
                      element_bytes: int, memory_s: float) -> float:
        """Seconds of a GEMM with K cut ``splits`` ways, its launch overhead apart: waves of tiles,
        each walking its share of K, or the kernel's memory traffic (``memory_s``) if longer; cut,
        each tile stores fp32 partial sums (traffic of the kernel too), which a reduction kernel
        then reads and sums into the output, memory-bound and with a launch of its own."""
        eff = self.accelerator.efficiency
        units = self.accelerator.compute_units
        tile_m, tile_n = eff.gemm_tile
        depth = math.ceil(k / splits)
        epilogue = PARTIAL_SUM_BYTES if splits > 1 else op.epilogue_bytes or element_bytes
        useful_s = 2.0 * tile_m * tile_n * depth / (gemm_flops / units)
        steps = 1.0 if eff.gemm_tile_k is None else tile_fill_efficiency(
            depth, eff.gemm_tile, eff.gemm_tile_k, element_bytes, epilogue,
            gemm_flops / units, self.memory_bandwidth / units, eff.gemm_epilogue_overlap)
        # the op's own FLOPs at the tiling's pace (they can differ from the shape's: a strided
        # convolution's input gradient runs as a GEMM over every input position)
        tiles_s = tile_waves(batch, m, n, eff.gemm_tile, units, splits) * useful_s / steps \
            * op.flops / (2.0 * batch * m * n * k)
        if splits == 1:
            return max(tiles_s, memory_s)
        partial_bytes = batch * m * n * splits * PARTIAL_SUM_BYTES
        reduction_s = (partial_bytes + batch * m * n * (op.epilogue_bytes or element_bytes)) / self.memory_bandwidth
        return max(tiles_s, memory_s + partial_bytes / self.memory_bandwidth) + reduction_s + self.overhead_s

    def pieces_time(self, op: Op, pieces: int) -> float:
        """Seconds of a GEMM cut along its rows into ``pieces`` GEMMs of their own, one after the
        other (Transformer Engine's userbuffers overlap: each piece as its input arrives, or before
        its output is reduce-scattered): each piece reads the whole weight again and fills the SMs
        with its own waves of tiles."""
        if pieces <= 1 or op.kind != "gemm" or op.shape is None or self.calibration is not None:
            return self.time(op)
        batch, m, n, k = op.shape
        weight_bytes = batch * k * n * BYTES_PER_ELEMENT[op.dtype or self.dtype]
        # the fp8 cast of the whole input runs once, before the pieces
        piece = replace(op, shape=(batch, math.ceil(m / pieces), n, k), flops=op.flops / pieces,
                        bytes=(op.bytes - weight_bytes) / pieces + weight_bytes, cast_bytes=0.0)
        return pieces * self.time(piece) + self._cast_s(op)

    def _time(self, op: Op) -> float:
        if self.calibration is not None:
            return self.calibration.op_seconds(op)
        memory_s = op.bytes / (self.memory_bandwidth * op.bandwidth_share)
        dtype = op.dtype or self.dtype
        if op.kind == "gemm":
            assert op.shape is not None
            batch = op.shape[0]
            if op.streams > 0:
                # launched one by one over the streams, at most ``streams`` run at a time: no faster
                # than all their tiles as one kernel, nor than one GEMM's time for each of the
                # ceil(batch / streams) that must run one after another on a stream (a kernel
                # overhead each; the streams overlap the rest)
                turns = math.ceil(batch / op.streams)
                compute_s = max(self._gemm_s(op, batch, memory_s, dtype),
                                turns * self._gemm_s(op, 1, memory_s / batch, dtype))
                return compute_s + self.overhead_s * turns + self._cast_s(op)
            # the fastest split, its memory traffic included (so the max below is already taken)
            compute_s = memory_s = self._gemm_s(op, batch, memory_s, dtype)
        elif op.kind == "attention":
            compute_s = self._attention_s(op, dtype)
        elif op.kind == "memory":
            compute_s = 0.0
        else:
            raise ValueError(f"{op.name} is a {op.kind}, not a compute op")
        return max(compute_s, memory_s) + self.overhead_s * op.launches + self._cast_s(op)

    def _gemm_s(self, op: Op, batch: int, memory_s: float, dtype: str) -> float:
        """Seconds of ``batch`` of the op's GEMMs as one kernel, at its fastest split of K, their
        memory traffic (``memory_s``) included."""
        eff = self.accelerator.efficiency
        _, m, n, k = op.shape
        share = replace(op, flops=op.flops * batch / op.shape[0])
        return min(self._split_gemm_s(share, batch, m, n, k, splits, self._gemm_flops(dtype), BYTES_PER_ELEMENT[dtype],
                                      memory_s)
                   for splits in split_k_choices(batch, m, n, k, eff.gemm_tile, eff.gemm_tile_k,
                                                 self.accelerator.compute_units))

    def _cast_s(self, op: Op) -> float:
        """The fp8 cast before a GEMM: memory-bound kernels of its own (none without one)."""
        return op.cast_bytes / self.memory_bandwidth + self.overhead_s * op.cast_launches if op.cast_bytes else 0.0
