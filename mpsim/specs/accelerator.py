"""An accelerator (GPU, TPU, ...): what its datasheet promises and how close kernels get.

Peak numbers are dense (no 2:4 sparsity). The ``efficiency`` block says how much of
the peak real kernels reach, per kind of op, because one number is not enough: GEMMs
follow the best measured matmul throughput scaled by how well the output tiles fill the
chip (wave quantization) and how long each tile's main loop runs against its fixed load
and store phases (``gemm_tile_k``), memory-bound ops follow the HBM bandwidth, fused
attention kernels have their own published fraction of peak, or, where a sweep of the
kernel over sequence lengths is published, its measured rate at the length and head size
each call sees (``attention_sweep``; ``other_attention_kernels``: other kernels measured
on the part, which a scenario picks by id).

``device_kind`` and ``device_names`` say which real devices the file describes, so a
calibration profile measured on one device is not applied to another: a profile
records the torch device kind and the name the device reported
(``torch.cuda.get_device_name()``, a Kineto trace's ``deviceProperties.name``, or the
CPU model), and :meth:`AcceleratorSpec.matches_device` compares them with the file's
case-insensitive shell patterns.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from mpsim.specs.base import Spec
from mpsim.units import Bandwidth, Bytes, FlopRate, Seconds

DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]

BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class MemorySpec(Spec):
    """Device memory (HBM): capacity and peak bandwidth."""

    capacity: Bytes = Field(gt=0)
    bandwidth: Bandwidth = Field(gt=0)


class SweepSeries(Spec):
    """One set of a kernel's measured rates over a sweep's sequence lengths.

    A source may measure the causal mask only (cuDNN's own B200 table): then the unmasked
    series are absent and unmasked calls are not covered (ComputeModel prices them at the
    part's single attention fractions). An absent backward is inferred as the owning class
    says.
    """

    forward: tuple[FlopRate, ...] | None = Field(None, description="forward without a mask, FLOP/s at each length; "
                                                                   "absent: measured under a causal mask only")
    forward_causal: tuple[FlopRate, ...] = Field(description="forward with a causal mask, FLOP/s at each length")
    backward: tuple[FlopRate, ...] | None = Field(None, description="backward without a mask, FLOP/s at each "
                                                                    "length; absent: inferred")
    backward_causal: tuple[FlopRate, ...] | None = Field(None, description="backward with a causal mask; absent: "
                                                                             "inferred")
    # where a file fills a series from another part's or another length's measurement (the same
    # die, a published ratio), which points are this part's own readings, for the reader
    measured_lengths: tuple[int, ...] | None = Field(
        None, description="the lengths at which these series were measured on this part, the others inferred (the "
                          "file's comments say from what); absent: measured at every length; []: inferred throughout")

    def series(self) -> tuple[tuple[float, ...], ...]:
        """Every series given (for the checks)."""
        return tuple(s for s in (self.forward, self.forward_causal, self.backward, self.backward_causal)
                     if s is not None)


class HeadDimSweepSpec(SweepSeries):
    """The same kernel's sweep at another head dimension, over the parent's sequence lengths.

    Sources often print only the forward at other head dimensions; an absent backward is
    the parent's backward (same length and mask) times this forward over the parent's.
    """

    head_dim: int = Field(gt=0, description="head dimension of these series")


class Fp8SweepSpec(SweepSeries):
    """The same kernel with fp8 inputs (Transformer Engine's fp8 attention), at the parent's
    head dimension and lengths; a call with another head size scales it by the bf16 sweep's
    ratio between the two sizes. An absent backward follows the parent's rules on these series.
    """


def _log2_between(x: float, points: tuple[int, ...], values: list[float]) -> float:
    """Linear in log2(x) between the two points around ``x``; the end value outside them."""
    if x <= points[0]:
        return values[0]
    if x >= points[-1]:
        return values[-1]
    upper = next(i for i, point in enumerate(points) if point >= x)
    lo, hi = points[upper - 1], points[upper]
    weight = (math.log2(x) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return values[upper - 1] + weight * (values[upper] - values[upper - 1])


class AttentionSweepSpec(SweepSeries):
    """A fused attention kernel's published throughput against sequence length and head size.

    One series per pass and mask, measured at one head dimension in bf16/fp16 over a
    sweep of sequence lengths (keys per query of one kernel call). Between two measured
    lengths the rate is interpolated linearly in log2(length); outside the sweep the end
    value holds. ``backward_causal`` is optional: where the source did not measure it, the
    backward under a causal mask is the unmasked backward times the forward's
    masked/unmasked ratio at that length (the mask costs both passes the same skipped and
    partly masked blocks).

    ``other_head_dims`` carries the same kernel at other head dimensions (a head of 64
    keeps its tensor cores busy for half as long per loaded block as one of 128, so runs
    slower per FLOP; one of 256 faster, until its tiles no longer fit). A call is priced
    at its own head dimension: between two measured ones linearly in log2(head_dim),
    outside them at the nearest.
    """

    kernel: str = Field(min_length=1, description="the kernel measured (cuDNN fused attention, FlashAttention-2, ...)")
    id: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]*$",
                           description="the short name a scenario picks this kernel by (training.attention_kernel)")
    head_dim: int = Field(gt=0, description="head dimension of the sweep")
    seq_lengths: tuple[int, ...] = Field(min_length=2, description="sequence lengths measured, increasing")
    other_head_dims: tuple[HeadDimSweepSpec, ...] = Field(
        (), description="the same kernel measured at other head dimensions, over the same lengths")
    fp8: Fp8SweepSpec | None = Field(None, description="the same kernel measured with fp8 inputs; absent: fp8 "
                                                       "attention runs at the bf16 rates")

    @model_validator(mode="after")
    def _consistent(self) -> "AttentionSweepSpec":
        if any(b <= a for a, b in zip(self.seq_lengths, self.seq_lengths[1:])) or self.seq_lengths[0] <= 0:
            raise ValueError(f"seq_lengths must be positive and increasing, got {list(self.seq_lengths)}")
        fp8 = (("fp8.", self.fp8),) if self.fp8 is not None else ()
        owned: list[tuple[str, SweepSeries]] = [
            ("", self), *((f"other_head_dims (head_dim {other.head_dim}).", other) for other in self.other_head_dims),
            *fp8]
        for where, owner in owned:
            for name in ("forward", "forward_causal", "backward", "backward_causal"):
                series = getattr(owner, name)
                if series is None:
                    continue
                if len(series) != len(self.seq_lengths):
                    raise ValueError(f"{where}{name} has {len(series)} values for {len(self.seq_lengths)} "
                                     f"seq_lengths")
                if any(not value > 0 for value in series):
                    raise ValueError(f"{where}{name} must be positive FLOP/s at every length")
            measured = owner.measured_lengths or ()
            if any(b <= a for a, b in zip(measured, measured[1:])) or not set(measured) <= set(self.seq_lengths):
                raise ValueError(f"{where}measured_lengths must be some of seq_lengths {list(self.seq_lengths)}, "
                                 f"increasing, got {list(measured)}")
        for where, series in (("", self), *fp8):
            if (series.forward is None) != (series.backward is None):
                raise ValueError(f"{where}forward and {where}backward (without a mask) go together: give both, or "
                                 f"neither where the source measured a causal mask only")
            if series.forward is None and series.backward_causal is None:
                raise ValueError(f"{where}backward_causal is needed where the sweep has no unmasked series (it "
                                 f"cannot be inferred from them)")
        for other in self.other_head_dims:
            if (other.forward is None) != (self.forward is None):
                raise ValueError(f"other_head_dims (head_dim {other.head_dim}).forward must be given exactly where "
                                 f"the sweep's own unmasked forward is")
        dims = [self.head_dim, *(other.head_dim for other in self.other_head_dims)]
        if len(set(dims)) != len(dims):
            raise ValueError(f"other_head_dims repeats a head dimension: {dims}")
        return self

    def fastest(self) -> float:
        """The highest rate any series gives (for the check against the peak)."""
        series = [*self.series(), *(s for other in self.other_head_dims for s in other.series())]
        return max(max(s) for s in series)

    def fastest_fp8(self) -> float:
        """The highest fp8 rate (for the check against the fp8 peak); 0 without fp8 series."""
        return max(max(s) for s in self.fp8.series()) if self.fp8 is not None else 0.0

    def covers(self, causal: bool, fp8: bool = False) -> bool:
        """Whether the sweep prices calls with (``causal``) or without a causal mask, in fp8 or not."""
        if fp8:
            return self.fp8 is not None and (causal or self.fp8.forward is not None)
        return causal or self.forward is not None

    def _own_rate(self, seq: int, backward: bool, causal: bool, measured: SweepSeries | None = None) -> float:
        """The rate of the sweep's own series, or of ``measured`` (its fp8 series), at its head size."""
        measured = self if measured is None else measured
        if backward and causal and measured.backward_causal is None:
            masked_share = self._own_rate(seq, False, True, measured) / self._own_rate(seq, False, False, measured)
            return self._own_rate(seq, True, False, measured) * masked_share
        series = (measured.backward_causal if causal else measured.backward) if backward else \
            (measured.forward_causal if causal else measured.forward)
        assert series is not None
        return _log2_between(seq, self.seq_lengths, list(series))

    def _other_rate(self, other: HeadDimSweepSpec, seq: int, backward: bool, causal: bool) -> float:
        series = other.forward_causal if causal else other.forward
        assert series is not None
        forward = _log2_between(seq, self.seq_lengths, list(series))
        if not backward:
            return forward
        given = other.backward_causal if causal else other.backward
        if given is not None:
            return _log2_between(seq, self.seq_lengths, list(given))
        if causal and other.backward is not None:  # the parent's rule, on this head dimension's series
            return self._other_rate(other, seq, True, False) * forward / self._other_rate(other, seq, False, False)
        # the parent's backward scaled by how this head dimension's forward compares with the parent's
        return self._own_rate(seq, True, causal) * forward / self._own_rate(seq, False, causal)

    def rate(self, seq: int, backward: bool, causal: bool, head_dim: int = 0, fp8: bool = False) -> float:
        """FLOP/s of one kernel call whose queries see ``seq`` keys, with heads of ``head_dim``
        (0: the sweep's own), with fp8 inputs or not; only for what the sweep :meth:`covers`."""
        if not self.covers(causal, fp8):
            what = "no fp8 series" if fp8 and self.fp8 is None else "a causal mask only"
            raise ValueError(f"{self.kernel}: the sweep measured {what}")
        if fp8:
            assert self.fp8 is not None
            own = self._own_rate(seq, backward, causal, self.fp8)
            if head_dim <= 0 or head_dim == self.head_dim or not self.covers(causal):
                return own
            # another head size: the fp8 rate scaled as the bf16 sweep scales between the two sizes
            return own * self.rate(seq, backward, causal, head_dim) / self._own_rate(seq, backward, causal)
        if not self.other_head_dims or head_dim <= 0 or head_dim == self.head_dim:
            return self._own_rate(seq, backward, causal)
        by_dim = sorted([(self.head_dim, None), *((other.head_dim, other) for other in self.other_head_dims)],
                        key=lambda item: item[0])
        rates = [self._own_rate(seq, backward, causal) if other is None else
                 self._other_rate(other, seq, backward, causal) for _, other in by_dim]
        return _log2_between(head_dim, tuple(dim for dim, _ in by_dim), rates)


class EfficiencySpec(Spec):
    """Fractions of peak that real kernels reach on this device."""

    gemm: float = Field(gt=0, le=1, description="best measured matmul throughput / peak")
    gemm_fp8: float | None = Field(None, gt=0, le=1, description="the same for fp8 GEMMs / fp8 peak; absent: "
                                                                 "as gemm")
    gemm_tile: tuple[PositiveInt, PositiveInt] = Field(
        (128, 256), description="output tile (rows, cols) of large-GEMM kernels, for wave quantization"
    )
    gemm_tile_k: int | None = Field(64, gt=0, description="depth along K of one main-loop step of those kernels: "
                                                          "a tile's operands are loaded this many columns at a "
                                                          "time; null: tiles are fed from caches (a CPU), no "
                                                          "load and store phases")
    gemm_epilogue_overlap: bool = Field(False, description="the GEMM kernels hide a tile's output store behind "
                                                           "another tile's main loop (Hopper's warp-specialized "
                                                           "persistent kernels), so only its first load waits")
    # A short benchmark (a MAMF sweep, a kernel paper's table) finds a cool GPU below its power
    # limit, at its top clock; a training step keeps it at the limit, where it lowers the clock
    sustained_compute: float = Field(1.0, gt=0, le=1, description="GEMM throughput under continuous load at the "
                                                                  "power limit / the short-burst throughput that "
                                                                  "gemm measured; 1: not measured")
    # each kind of kernel draws its own power, so the GPU holds its own clock under it
    sustained_attention: float | None = Field(None, gt=0, le=1, description="the same for fused attention "
                                                                            "against the attention sweep; "
                                                                            "absent: sustained_compute")
    sustained_compute_fp8: float | None = Field(None, gt=0, le=1, description="the same for fp8 GEMMs against "
                                                                              "gemm_fp8's rate; absent: "
                                                                              "sustained_compute")
    memory: float = Field(gt=0, le=1, description="achieved / peak HBM bandwidth for streaming ops")
    attention_forward: float = Field(gt=0, le=1, description="fused attention forward, fraction of peak")
    attention_backward: float = Field(gt=0, le=1, description="fused attention backward, fraction of peak")
    attention_sweep: AttentionSweepSpec | None = Field(
        None, description="the fused attention kernel's published throughput by sequence length (bf16/fp16); "
                          "absent: attention_forward/backward at every length")
    # A part runs whichever fused kernel the framework calls: Transformer Engine cuDNN's on Hopper,
    # the flash-attn package and older PyTorch FlashAttention-2's, at very different rates
    other_attention_kernels: tuple[AttentionSweepSpec, ...] = Field(
        (), description="other fused attention kernels measured on this part, each with an id a scenario picks it "
                        "by (training.attention_kernel); attention_sweep is the one a run gets otherwise")
    kernel_overhead: Seconds = Field(ge=0, description="fixed cost per kernel (launch gap)")

    @model_validator(mode="after")
    def _kernels_named(self) -> "EfficiencySpec":
        if self.other_attention_kernels and self.attention_sweep is None:
            raise ValueError("other_attention_kernels needs attention_sweep, the kernel a run gets by default")
        for sweep in self.other_attention_kernels:
            if sweep.id is None:
                raise ValueError(f"other_attention_kernels: {sweep.kernel!r} needs an id to be picked by")
        ids = [sweep.id for sweep in self.attention_kernels() if sweep.id is not None]
        if len(set(ids)) != len(ids):
            raise ValueError(f"attention kernel ids repeat: {ids}")
        return self

    def attention_kernels(self) -> tuple[AttentionSweepSpec, ...]:
        """Every fused attention kernel measured on this part, the default first."""
        return (self.attention_sweep, *self.other_attention_kernels) if self.attention_sweep is not None else ()

    def attention_kernel(self, kernel_id: str | None) -> AttentionSweepSpec | None:
        """The sweep of the kernel ``kernel_id`` (None: the default, attention_sweep); None when the part
        carries no sweep of it."""
        if kernel_id is None:
            return self.attention_sweep
        return next((sweep for sweep in self.attention_kernels() if sweep.id == kernel_id), None)


class AcceleratorSpec(Spec):
    """One accelerator model, from its datasheet."""

    name: str
    vendor: str = ""
    description: str = ""
    peak_flops: dict[DType, FlopRate]
    memory: MemorySpec
    compute_units: int = Field(gt=0, description="SMs / CUs / cores: parallel units GEMM tiles fill")
    efficiency: EfficiencySpec
    device_kind: Literal["cpu", "cuda"] = Field(
        "cuda", description="the torch device kind a calibration profile of this part records: cuda for GPUs "
                            "(NVIDIA, and AMD's under ROCm), cpu for the host's cores")
    device_names: list[str] = Field(
        default_factory=list, description="names this part reports as a device (torch.cuda.get_device_name(), "
                                          "nvidia-smi's name, a profiler trace's deviceProperties.name), as "
                                          "case-insensitive shell patterns; a calibration profile measured on "
                                          "a device whose name none of them matches is refused. Empty: no "
                                          "profile is accepted")

    @model_validator(mode="after")
    def _positive_peaks(self) -> "AcceleratorSpec":
        for dtype, value in self.peak_flops.items():
            if value <= 0:
                raise ValueError(f"peak_flops.{dtype} must be positive, got {value}")
        for sweep in self.efficiency.attention_kernels():
            peak = self.peak_flops.get("bf16") or self.peak_flops.get("fp16")
            if peak is None:
                raise ValueError("efficiency.attention_sweep needs a bf16 or fp16 peak to be measured against")
            fastest = sweep.fastest()
            where = "attention_sweep" if sweep is self.efficiency.attention_sweep else \
                f"other_attention_kernels ({sweep.id})"
            if fastest > peak:
                raise ValueError(f"efficiency.{where}: {fastest / 1e12:.0f} TFLOP/s is above the 16-bit "
                                 f"peak of {peak / 1e12:.0f} TFLOP/s")
            if sweep.fp8 is not None:
                fp8_peak = self.peak_flops.get("fp8")
                if fp8_peak is None:
                    raise ValueError(f"efficiency.{where}.fp8 needs an fp8 peak to be measured against")
                if sweep.fastest_fp8() > fp8_peak:
                    raise ValueError(f"efficiency.{where}.fp8: {sweep.fastest_fp8() / 1e12:.0f} TFLOP/s is above "
                                     f"the fp8 peak of {fp8_peak / 1e12:.0f} TFLOP/s")
        return self

    def matches_device(self, kind: str, name: str) -> bool:
        """Whether a device of torch kind ``kind`` that reported ``name`` is this part."""
        if kind != self.device_kind:
            return False
        reported = " ".join(name.split()).casefold()  # names come padded or with doubled spaces
        return any(fnmatch.fnmatchcase(reported, pattern.casefold()) for pattern in self.device_names)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``."""
        return self.peak_flops[dtype]  # type: ignore[index]
