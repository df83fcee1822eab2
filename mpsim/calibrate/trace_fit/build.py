"""From trace samples to a calibration profile, with its error on held-out kernels.

The samples are split by shape (``split.py``); GEMM, collective and memory-bound fits
see only the fitted half. Each held-out kernel is then priced twice: by the datasheet
model alone (``before``) and as the fitted profile would price it in ``mpsim run``
(``after``: its dtype's GEMM fit, its collective line, or the datasheet where the profile
has neither). The errors are absolute relative errors of the kernel's time, one per
kernel. The final profile is fitted again on every kernel, since the split exists only to
measure how well the form predicts shapes it has not seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpsim.calibrate.trace_fit.comms import datasheet_seconds, fit_collectives, fitted_seconds
from mpsim.calibrate.trace_fit.gemm import DatasheetGemm, fit_gemms
from mpsim.calibrate.trace_fit.memory import fit_memory, launch_summary
from mpsim.calibrate.trace_fit.samples import TraceSamples
from mpsim.calibrate.trace_fit.split import HOLD_OUT_RULE, split_by_key
from mpsim.specs.accelerator import AcceleratorSpec
from mpsim.specs.calibration import (CalibrationProfile, ComputeProfile, DeviceInfo, HeldOutError, LinksProfile,
                                     TraceFitInfo)
from mpsim.specs.system import SystemSpec


@dataclass
class HeldOut:
    """Per held-out kernel: absolute relative error (%) before and after fitting."""

    before_pct: list[float] = field(default_factory=list)
    after_pct: list[float] = field(default_factory=list)
    shapes: set = field(default_factory=set)
    # per kernel: no other stream's kernel ran beside it (None: not looked at, as for collectives)
    alone: list[bool | None] = field(default_factory=list)

    def add(self, key, measured_s: float, before_s: float, after_s: float, alone: bool | None = None) -> None:
        self.before_pct.append(100.0 * abs(before_s / measured_s - 1.0))
        self.after_pct.append(100.0 * abs(after_s / measured_s - 1.0))
        self.shapes.add(key)
        self.alone.append(alone)

    def after_pct_where(self, alone: bool) -> list[float]:
        return [error for error, was_alone in zip(self.after_pct, self.alone) if was_alone is alone]

    def summary(self) -> HeldOutError:
        def stat(values, how):
            return round(float(how(values)), 3) if values else None
        alone, beside = self.after_pct_where(True), self.after_pct_where(False)
        return HeldOutError(kernels=len(self.after_pct), shapes=len(self.shapes),
                            before_median_pct=stat(self.before_pct, np.median),
                            before_max_pct=stat(self.before_pct, np.max),
                            after_median_pct=stat(self.after_pct, np.median),
                            after_max_pct=stat(self.after_pct, np.max),
                            alone_kernels=len(alone), alone_after_median_pct=stat(alone, np.median),
                            beside_kernels=len(beside), beside_after_median_pct=stat(beside, np.median))


def beside_collective_s(alone_s: float, collective_share: float, sm_share: float) -> float:
    """A compute kernel's time when a collective holding ``sm_share`` of the SMs ran beside it for
    ``collective_share`` of that time: it runs at ``1 - sm_share`` of its speed while the
    collective runs, as ``overlapped_s`` in ``mpsim/cost/actions.py`` prices compute beside a
    collective, so ``alone_s = t (1 - collective_share) + t collective_share (1 - sm_share)``."""
    return alone_s / max(1e-9, 1.0 - sm_share * collective_share)


@dataclass
class TraceFitResult:
    """The profile and the held-out errors behind its ``trace_fit`` summary."""

    profile: CalibrationProfile
    gemm: HeldOut
    collectives: HeldOut


def held_out_gemms(samples: TraceSamples, accelerator: AcceleratorSpec, skipped: dict[str, int],
                   sm_share: float = 0.0) -> HeldOut:
    """Fit GEMMs on the fitted half, price the held-out half before and after: each kernel as
    mpsim would price it where it ran, beside a collective holding ``sm_share`` of the SMs for
    the share of its time the trace shows one beside it."""
    datasheet = DatasheetGemm(accelerator)
    known = [s for s in samples.gemms if datasheet.knows(s.dtype)]
    if len(known) < len(samples.gemms):
        skipped["GEMMs in a dtype the accelerator file has no peak for"] = len(samples.gemms) - len(known)
    fitted, held = split_by_key(known, key=lambda s: s.key)
    fits = {fit.dtype: fit for fit in fit_gemms(fitted, accelerator)[0]}
    result = HeldOut()
    for sample in held:
        before = datasheet.seconds(sample)
        fit = fits.get(sample.dtype)
        flops = 2.0 * sample.batch * sample.m * sample.n * sample.k
        covered = fit is not None and fit.covers(flops)
        after = fit.seconds(sample.batch, sample.m, sample.n, sample.k) if covered else before
        result.add(sample.key, sample.seconds, beside_collective_s(before, sample.beside_collective, sm_share),
                   beside_collective_s(after, sample.beside_collective, sm_share), sample.alone)
    return result


def held_out_collectives(samples: TraceSamples, system: SystemSpec, skipped: dict[str, int]) -> HeldOut:
    """Fit collective lines on the fitted half, price the held-out half before and after."""
    priced = [s for s in samples.collectives if (s.ranks or s.world_size)]
    if len(priced) < len(samples.collectives):
        skipped["collectives of unknown group and job size"] = len(samples.collectives) - len(priced)
    fitted, held = split_by_key(priced, key=lambda s: s.key, group=lambda s: s.group)
    fits = fit_collectives(fitted)[0]
    result = HeldOut()
    for sample in held:
        before = datasheet_seconds(sample, system, sample.ranks or sample.world_size)
        after = fitted_seconds(sample, fits)
        result.add(sample.key, sample.seconds, before, after if after is not None else before)
    return result


def build_profile(samples: TraceSamples, traces: list[str], device_name: str, device_sms: int | None,
                  system_name: str, system: SystemSpec, accelerator: AcceleratorSpec,
                  created: str = "") -> TraceFitResult:
    """The profile fitted on every usable kernel of ``samples``, and its held-out errors."""
    skipped: dict[str, int] = dict(samples.skipped)
    gemm_error = held_out_gemms(samples, accelerator, skipped, system.collective_sm_share(device_sms))
    collective_error = held_out_collectives(samples, system, skipped)
    gemm_fits, gemm_skipped = fit_gemms(samples.gemms, accelerator)
    collective_fits, collective_skipped = fit_collectives(samples.collectives)
    skipped.update({f"unfitted {reason}": count for reason, count in {**gemm_skipped, **collective_skipped}.items()})
    memory_fit = fit_memory(samples.memory)
    if memory_fit is None and samples.memory:
        skipped["memory-bound kernels (too few sizes for a line)"] = len(samples.memory)
    dtype = max(gemm_fits, key=lambda f: f.kernels).dtype if gemm_fits else "fp32"
    compute = ComputeProfile(dtype=dtype, gemm_fits=gemm_fits, memory_fit=memory_fit,
                             launch=launch_summary(samples.waiting_gaps_s, samples.queued_gaps_s,
                                                   samples.forward_intervals_s, samples.backward_intervals_s,
                                                   samples.forward_within_passes, samples.backward_within_passes))
    links = LinksProfile(backend="nccl", collectives=collective_fits) if collective_fits else None
    info = TraceFitInfo(traces=traces, system=system_name, accelerator=accelerator.name, held_out=HOLD_OUT_RULE,
                        gemm=gemm_error.summary(), collectives=collective_error.summary(),
                        skipped=dict(sorted(skipped.items())), peer_waits_taken_out=samples.peer_waits_taken_out,
                        peer_waits_kept=dict(sorted(samples.peer_waits_kept.items())))
    profile = CalibrationProfile(
        source="trace", description=f"fitted from {len(traces)} profiler trace(s) of {device_name}", created=created,
        device=DeviceInfo(kind="cuda", name=device_name, compute_units=device_sms), compute=compute, links=links,
        trace_fit=info)
    return TraceFitResult(profile, gemm_error, collective_error)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def format_trace_fit(profile: CalibrationProfile) -> list[str]:
    """Lines for the terminal: what was fitted and the held-out errors before and after."""
    info = profile.trace_fit
    assert info is not None
    lines = [f"device       cuda: {profile.device.name} (datasheet: {info.accelerator} in {info.system})"]
    for fit in profile.compute.gemm_fits:
        efficiency = "-" if fit.efficiency is None else f"{100 * fit.efficiency:.1f} % of peak"
        bandwidth = "-" if fit.bandwidth is None else f"{fit.bandwidth / 1e9:.0f} GB/s"
        output = "-" if fit.output_bandwidth is None else f"{fit.output_bandwidth / 1e9:.0f} GB/s"
        if fit.misaligned_efficiency is not None:
            efficiency += f" ({100 * fit.misaligned_efficiency:.1f} % misaligned)"
        lines.append(f"  gemm {fit.dtype:<6} t = {fit.launch_s * 1e6:.2f} us + flops at {efficiency} + operands at "
                     f"{bandwidth} + output at {output}  ({fit.kernels} kernels, {fit.shapes} shapes, median error "
                     f"{fit.median_error_pct:.1f} %)")
    memory = profile.compute.memory_fit
    if memory is not None:
        lines.append(f"  memory      {memory.bandwidth / 1e9:.0f} GB/s after {memory.latency_s * 1e6:.2f} us "
                     f"(rms error {100 * memory.rms_error:.1f} %)")
    launch = profile.compute.launch
    if launch is not None:
        def us(value):
            return "n/a" if value is None else f"{value * 1e6:.2f} us"
        lines.append(f"  launch gaps waiting for the CPU {us(launch.waiting_gap_s)} ({launch.waiting_samples}), "
                     f"queued {us(launch.queued_gap_s)} ({launch.queued_samples}); the host launched a kernel "
                     f"every {us(launch.host_interval_s)} ({launch.host_interval_statistic} of "
                     f"{launch.host_interval_samples} intervals; forwards "
                     f"{us(launch.host_interval_forward_s)}, backwards {us(launch.host_interval_backward_s)})")
    for fit in (profile.links.collectives if profile.links else []):
        lines.append(f"  {fit.kind:<14} {fit.algorithm or '?'}/{fit.protocol or '?'} on {fit.ranks or '?'} ranks: "
                     f"{fit.latency_s * 1e6:.1f} us + bytes at "
                     f"{'-' if fit.bandwidth is None else format(fit.bandwidth / 1e9, '.2f') + ' GB/s'} "
                     f"({fit.kernels} kernels, {len(fit.points)} sizes)")
    if info.peer_waits_taken_out or info.peer_waits_kept:
        kept = "; ".join(f"{count} still hold theirs ({reason})" for reason, count in info.peer_waits_kept.items())
        lines.append(f"  peer waits  taken out of {info.peer_waits_taken_out} collective kernels (timed from their "
                     f"last rank's start){'; ' + kept if kept else ''}")
    lines.append(f"held out     {info.held_out}")
    for name, error in (("gemm", info.gemm), ("collectives", info.collectives)):
        lines.append(f"  {name:<12} {error.kernels} kernels, {error.shapes} shapes: median error "
                     f"{_pct(error.before_median_pct)} -> {_pct(error.after_median_pct)}, max "
                     f"{_pct(error.before_max_pct)} -> {_pct(error.after_max_pct)} (datasheet -> fitted)")
        if error.beside_kernels:
            lines.append(f"  {'':<12} fitted, median error of the {error.alone_kernels} that ran alone "
                         f"{_pct(error.alone_after_median_pct)}, of the {error.beside_kernels} beside other streams' "
                         f"kernels {_pct(error.beside_after_median_pct)} (priced with the slowdown beside a "
                         f"collective)")
    for reason, count in info.skipped.items():
        lines.append(f"  skipped      {count} {reason}")
    return lines
