"""GEMM kernel time against shape, before fitting (the datasheet model) and after.

Before fitting, a trace's GEMM is priced as mpsim prices any GEMM
(``mpsim/cost/compute.py``): the accelerator's peak for the math mode times its best
measured matmul efficiency, the wave quantization of the output tiles over the SMs, the
share of each tile's time spent in its main loop, and K split where the tiles leave SMs
idle. That model is built for the large GEMMs of transformer training; the trace GEMMs
of recommendation models and CNNs are mostly small (7-300 us), where cuBLAS also picks
smaller tiles, which the datasheet model does not (37 % and 83 % median error on the
held-out GEMMs of two recommendation-model traces, ``benchmarks/trace_calibration.py``).

The fitted form keeps the physics a GEMM kernel cannot escape, four numbers per math
mode (:class:`~mpsim.specs.calibration.GemmShapeFit`)::

    t = launch_s + flops / (peak * efficiency) + operand_bytes / bandwidth
                 + output_bytes / output_bandwidth

a fixed part (launch, prologue, epilogue, split-K reduction: what even a tiny product
costs), the FLOPs at a fitted fraction of the tensor cores' peak, and the bytes the
kernel must move at least once at fitted rates: the operands, read through the L2 cache
that many tiles share, and the output, written to memory (with its partial sums when
cuBLAS splits K). On the 8-rank trace, one bandwidth for both held out at 17 % median
error, two at 13 % (``docs/calibration.md``).

A GEMM with a dimension that is not a whole number of 16-byte vectors runs in the
library's element-at-a-time kernels (``align1`` in CUTLASS's kernel names, ``align4``
for the others on fp32 tensors), and its FLOPs cost more: a fifth term, their extra
cost, gives them an efficiency of their own below the others'
(``misaligned_efficiency``). On the 8-rank trace 1024 x 512 x 1705 takes 121 us in
``align1`` kernels where the aligned form predicts 35.

Every kernel is fitted, those that ran beside another stream's kernels too: fitting on
the kernels that ran alone (``mpsim/traces/concurrency.py``) was tried on the 8-rank
trace and predicted the held-out kernels that ran alone worse (14.7 % median against
9.4 %), the beside ones being of shapes the alone ones lack.

It is fitted by :func:`~mpsim.calibrate.trace_fit.robust.fit_nonnegative` on relative
error, one kernel one vote. A term that would need a negative cost, or FLOPs faster than
the peak, is dropped, not clamped; a dtype seen in fewer than four shapes gets as many
terms as it has shapes. No parameter belongs to one shape, so a held-out shape is a true
prediction. A fit prices GEMMs up to the largest it saw (``max_flops``): the small GEMMs
of a recommendation model say little about a 100 GFLOP transformer GEMM, which the
datasheet model, built and checked on those, prices instead.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mpsim.calibrate.trace_fit.robust import fit_nonnegative
from mpsim.calibrate.trace_fit.samples import GemmSample
from mpsim.cost.compute import ComputeModel
from mpsim.specs.accelerator import BYTES_PER_ELEMENT, AcceleratorSpec
from mpsim.specs.calibration import GemmShapeFit, gemm_misaligned
from mpsim.workload.ops import Op



def operand_bytes(sample: GemmSample) -> float:
    """Bytes of both operands, each read once."""
    b, m, n, k = sample.batch, sample.m, sample.n, sample.k
    return float(b * (m * k + k * n) * BYTES_PER_ELEMENT[sample.dtype])


def output_bytes(sample: GemmSample) -> float:
    """Bytes of the output, written once."""
    return float(sample.batch * sample.m * sample.n * BYTES_PER_ELEMENT[sample.dtype])


class DatasheetGemm:
    """The unfitted model's kernel time for trace GEMMs on one accelerator (one model per dtype)."""

    def __init__(self, accelerator: AcceleratorSpec):
        self.accelerator = accelerator
        self._models: dict[str, ComputeModel] = {}

    def knows(self, dtype: str) -> bool:
        return dtype in BYTES_PER_ELEMENT and dtype in self.accelerator.peak_flops

    def seconds(self, sample: GemmSample) -> float:
        """Kernel time: the model's op time less the gap it adds between kernels."""
        model = self._models.get(sample.dtype)
        if model is None:
            model = self._models[sample.dtype] = ComputeModel(self.accelerator, sample.dtype)
        shape = (sample.batch, sample.m, sample.n, sample.k)
        op = Op("trace gemm", "gemm", flops=2.0 * sample.batch * sample.m * sample.n * sample.k,
                bytes=operand_bytes(sample) + output_bytes(sample), shape=shape, dtype=sample.dtype)
        return model.time(op) - model.overhead_s


def _flops(sample: GemmSample) -> float:
    return 2.0 * sample.batch * sample.m * sample.n * sample.k


def misaligned(sample: GemmSample) -> bool:
    """A GEMM the library runs in element-at-a-time kernels (a dimension not a whole number of vectors)."""
    return gemm_misaligned(sample.m, sample.n, sample.k, BYTES_PER_ELEMENT[sample.dtype])


def fit_gemms(samples: list[GemmSample], accelerator: AcceleratorSpec) -> tuple[list[GemmShapeFit], dict[str, int]]:
    """One fit per math mode the accelerator has a peak for; and the kernels left unfitted, by reason."""
    by_dtype: dict[str, list[GemmSample]] = defaultdict(list)
    for sample in samples:
        by_dtype[sample.dtype].append(sample)
    fits, skipped = [], {}
    bandwidth = accelerator.memory.bandwidth
    for dtype in sorted(by_dtype):
        group = by_dtype[dtype]
        if dtype not in accelerator.peak_flops or dtype not in BYTES_PER_ELEMENT:
            skipped[f"{dtype} GEMMs (no {dtype} peak in {accelerator.name})"] = len(group)
            continue
        shapes = len({s.key for s in group})
        peak = accelerator.peak(dtype)
        # columns scaled to seconds at peak / at the datasheet bandwidth: the coefficients are then O(1)
        features = np.array([[1e-6, _flops(s) / peak, operand_bytes(s) / bandwidth, output_bytes(s) / bandwidth,
                              _flops(s) / peak if misaligned(s) else 0.0] for s in group])
        seconds = np.array([s.seconds for s in group])
        # the FLOPs term costs at least its time at peak: its coefficient is 1 / efficiency > 1; a
        # misaligned GEMM's FLOPs cost that and a non-negative extra (never less than an aligned one's)
        launch, per_flop, per_byte, per_output_byte, misaligned_extra = fit_nonnegative(
            features, seconds, floors=[0.0, 1.0, 0.0, 0.0, 0.0], max_terms=shapes, needs={4: 1})
        fit = GemmShapeFit(dtype=dtype, element_bytes=BYTES_PER_ELEMENT[dtype], peak_flops=peak,
                           launch_s=float(launch) * 1e-6,
                           efficiency=float(1.0 / per_flop) if per_flop > 0 else None,
                           bandwidth=float(bandwidth / per_byte) if per_byte > 0 else None,
                           output_bandwidth=float(bandwidth / per_output_byte) if per_output_byte > 0 else None,
                           misaligned_efficiency=(float(1.0 / (per_flop + misaligned_extra))
                                                  if misaligned_extra > 0 else None),
                           kernels=len(group), shapes=shapes,
                           max_flops=max(_flops(s) for s in group))
        errors = [abs(fit.seconds(s.batch, s.m, s.n, s.k) / s.seconds - 1.0) for s in group]
        fits.append(fit.model_copy(update={"median_error_pct": round(100.0 * float(np.median(errors)), 3)}))
    return fits, skipped
