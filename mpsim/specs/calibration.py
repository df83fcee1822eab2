"""The calibration profile: what was measured on a device, and the curves fitted to it.

A profile is a YAML (or JSON) file written by ``mpsim calibrate`` or ``mpsim validate``
and named by a scenario (``calibration: profiles/this_machine.yaml``). It replaces the
datasheet efficiencies of the scenario's accelerator and links:

* ``compute.gemm``: measured GEMMs (shape, operand layout, seconds) and a fitted
  efficiency curve for shapes that were not measured: ``t(F) = (F + F_half) / (peak * e_max)``,
  so the efficiency ``F / (t * peak)`` rises as ``e_max * F / (F + F_half)`` with the
  GEMM's FLOPs ``F``.
* ``compute.attention``: measured attention cores (fused and unfused) and, for unmeasured
  sizes, the fraction of peak the fused kernel reached forward and backward.
* ``compute.memory``: measured memory-bound ops by mpsim op name and bytes, a fit
  ``t = latency + bytes / bandwidth`` per op name and one over all of them (the
  streaming bandwidth, which also prices the optimizer step).
* ``compute.split_backward``: a decoder layer's backward run whole and split into input-
  and weight-gradient passes; the weight pass's slowdown on its own prices ``W`` actions.
* ``links``: alpha-beta fits ``t = latency + bytes / bandwidth`` of point-to-point sends
  and of each collective per group size, with the measured points behind them.
* ``fit`` (written by ``mpsim validate``): a multiplier on every op's speed and a fixed
  overhead per action, fitted on one schedule of a real training job.

A profile fitted from PyTorch profiler traces (``mpsim calibrate --from-trace``,
``source: trace``) has no microbenchmark points. Its GEMMs are ``compute.gemm_fits``,
one per math mode (tf32, fp32, ...): every kernel is a fixed part, a compute part and
two memory parts, ``t = launch_s + flops / (peak_flops * efficiency) + operand_bytes /
bandwidth + output_bytes / output_bandwidth``, so four numbers per dtype price every
shape (the operands read once, the output written once; the fit and its checks are in
``mpsim/calibrate/trace_fit``). Its collectives
carry the NCCL ``algorithm`` and ``protocol`` they ran with, may be kinds the
microbenchmarks never measure (send-recv, broadcast, all-to-all) and may lack ``ranks``
when the trace did not say the group size; ``compute.launch`` holds the gaps between
kernels; ``trace_fit`` the files, the held-out split and the errors before and after
fitting. What such a profile lacks (attention, point-to-point sends, the streaming fit
when no memory-bound kernel could be sized) stays absent and is priced from the
datasheet.

Each measured point carries its median ``seconds``, the ``spread`` of its repeats
(interquartile range / median) and the number of ``samples``. Units are SI: seconds,
bytes, bytes/s, FLOP, FLOP/s. The format is documented in ``docs/calibration.md``.

This module is plain pydantic (no torch, no other mpsim packages), so reading a profile
never needs the measurement tools.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

FORMAT = "mpsim-calibration/1"


class _Strict(BaseModel):
    """A misspelt field is an error; profiles are read-only once written."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Measured(_Strict):
    """Median of repeated timings, and how much the repeats scattered."""

    seconds: float = Field(gt=0)
    spread: float = Field(0.0, ge=0, description="interquartile range / median of the repeats")
    samples: int = Field(1, ge=1)


class GemmPoint(Measured):
    """One GEMM C[m, n] = A[m, k] B[k, n] (``batch`` of them) as mpsim writes its shape."""

    shape: tuple[int, int, int, int] = Field(description="(batch, m, n, k)")
    layout: str = Field(description="operand layout as a framework runs it: forward, dgrad, wgrad or batched")
    flops: float = Field(gt=0)


class GemmCurve(_Strict):
    """Efficiency of GEMMs against their FLOPs: ``t = (F + half_efficiency_flops) / (peak * max_efficiency)``."""

    peak_flops: float = Field(gt=0, description="the accelerator file's peak for the dtype, FLOP/s")
    max_efficiency: float = Field(gt=0, description="fraction of peak that large GEMMs reach")
    half_efficiency_flops: float = Field(ge=0, description="FLOPs at which a GEMM reaches half of max_efficiency")
    rms_error: float = Field(0.0, ge=0, description="root-mean-square relative error of the fit on its points")

    def seconds(self, flops: float) -> float:
        return (flops + self.half_efficiency_flops) / (self.peak_flops * self.max_efficiency)


class AttentionPoint(Measured):
    """One attention core, forward or backward, fused (SDPA) or the unfused path."""

    direction: Literal["forward", "backward"]
    fused: bool
    shape: tuple[int, int, int, int] = Field(description="(batch, heads, sequence, head_dim) on one rank")
    flops: float = Field(gt=0, description="FLOPs mpsim counts for it (causal blocks skipped)")


class AttentionCurve(_Strict):
    """Fraction of peak the fused attention core reached, for sizes not measured."""

    forward_fraction: float = Field(gt=0)
    backward_fraction: float = Field(gt=0)


class MemoryPoint(Measured):
    """One memory-bound op, named as mpsim names it, with the bytes mpsim counts for it."""

    name: str
    bytes: float = Field(gt=0)


class StreamFit(_Strict):
    """``t = latency_s + bytes / bandwidth`` (bytes/s)."""

    bandwidth: float = Field(gt=0)
    latency_s: float = Field(ge=0)
    rms_error: float = Field(0.0, ge=0)
    max_bytes: float | None = Field(None, gt=0, description="the largest size fitted (trace fits): larger ones are "
                                                            "priced from the datasheet, not extrapolated; null: any")

    def covers(self, message_bytes: float) -> bool:
        return self.max_bytes is None or message_bytes <= self.max_bytes

    def seconds(self, message_bytes: float) -> float:
        return self.latency_s + message_bytes / self.bandwidth



class SplitBackward(_Strict):
    """One decoder layer's backward as one pass and as input- then weight-gradient passes
    (measured by ``mpsim/calibrate/measure/splitbench.py``)."""

    full_s: float = Field(gt=0, description="the full backward (B)")
    input_s: float = Field(gt=0, description="the input-gradient pass (I)")
    weight_s: float = Field(gt=0, description="the weight-gradient pass run afterwards on its own (W)")
    weight_slowdown: float = Field(gt=0, description="W / (B - I), the median over the measurement passes: "
                                                     "multiplies the compute of every W action")
    spread: float = Field(0.0, ge=0, description="(max - min) / median of the per-pass ratios")
    samples: int = Field(1, ge=1, description="measurement passes")


# GPU GEMM kernels load operands in 16-byte vectors (cp.async / LDG.128 on NVIDIA); a matrix
# whose rows are not a whole number of vectors cannot be read that way, and the libraries fall
# back to kernels that load one element at a time (CUTLASS "align1"; NVIDIA's Matrix
# Multiplication Background guide asks for dimensions that are multiples of 16 bytes)
GEMM_VECTOR_BYTES = 16


def gemm_misaligned(m: int, n: int, k: int, element_bytes: int) -> bool:
    """Whether a GEMM has a dimension that is not a whole number of 16-byte vectors.

    Which dimensions are the operands' rows depends on their layout, which a shape does
    not give; all three are checked, as each is a row of one operand or of the output
    in some layout."""
    elements = max(1, GEMM_VECTOR_BYTES // element_bytes)
    return any(dim % elements for dim in (m, n, k))


class GemmShapeFit(_Strict):
    """GEMM kernel time against shape in one math mode, fitted on a trace's kernels:
    ``t = launch_s + flops / (peak_flops * efficiency) + operand_bytes / bandwidth
    + output_bytes / output_bandwidth``.

    ``operand_bytes`` is both operands read once, ``batch * (m k + k n)`` elements of
    ``element_bytes``; ``output_bytes`` the output written once, ``batch * m n`` of them.
    They are priced apart because a kernel streams its operands through the L2 cache
    while its output (and, when cuBLAS splits K, its partial outputs) goes to memory. A
    term is switched off (its field null) when the kernels gave it no weight: the others
    then carry the time.

    A GEMM with a dimension that is not a whole number of 16-byte vectors
    (:func:`gemm_misaligned`) runs in kernels that load their operands an element at a
    time (CUTLASS's ``align1`` variants, named so in the traces) and its FLOPs cost more:
    ``misaligned_efficiency`` is the fraction of the peak they run at, fitted on the
    trace's misaligned GEMMs (null when it had none, or they ran as fast as the others).
    """

    dtype: str = Field(description="the math mode: tf32, fp32, bf16, fp16 or fp8")
    element_bytes: int = Field(gt=0, description="bytes of one operand element as stored (4 for tf32 on fp32 tensors)")
    peak_flops: float = Field(gt=0, description="the accelerator file's peak for the dtype, FLOP/s")
    launch_s: float = Field(ge=0, description="fixed part of every kernel")
    efficiency: float | None = Field(None, gt=0, description="fraction of peak_flops the compute part runs at")
    bandwidth: float | None = Field(None, gt=0, description="bytes/s the operands are read at")
    output_bandwidth: float | None = Field(None, gt=0, description="bytes/s the output is written at")
    kernels: int = Field(0, ge=0, description="kernels fitted")
    shapes: int = Field(0, ge=0, description="distinct (batch, m, n, k) among them")
    median_error_pct: float = Field(0.0, ge=0, description="median absolute error on the fitted kernels")
    max_flops: float | None = Field(None, gt=0, description="the largest GEMM fitted: larger ones are priced from the "
                                                            "datasheet, not extrapolated; null: any")
    misaligned_efficiency: float | None = Field(None, gt=0, description="fraction of peak_flops the FLOPs of a GEMM "
                                                                        "with a dimension not a multiple of 16 bytes "
                                                                        "run at; null: as the others")

    def covers(self, flops: float) -> bool:
        return self.max_flops is None or flops <= self.max_flops

    def seconds(self, batch: int, m: int, n: int, k: int) -> float:
        seconds = self.launch_s
        flops = 2.0 * batch * m * n * k
        if self.misaligned_efficiency is not None and gemm_misaligned(m, n, k, self.element_bytes):
            seconds += flops / (self.peak_flops * self.misaligned_efficiency)
        elif self.efficiency is not None:
            seconds += flops / (self.peak_flops * self.efficiency)
        if self.bandwidth is not None:
            seconds += batch * (m * k + k * n) * self.element_bytes / self.bandwidth
        if self.output_bandwidth is not None:
            seconds += batch * m * n * self.element_bytes / self.output_bandwidth
        return seconds


class LaunchGaps(_Strict):
    """Idle time between consecutive kernels of one stream, from a trace."""

    waiting_gap_s: float | None = Field(None, ge=0, description="median gap when the next kernel's CPU op began after "
                                                                  "the previous kernel ended: the GPU waited for the "
                                                                  "CPU to launch it (the per-kernel cost of a "
                                                                  "launch-bound step)")
    waiting_samples: int = Field(0, ge=0)
    queued_gap_s: float | None = Field(None, ge=0, description="median gap when the next kernel was launched "
                                                                 "before the previous one ended: the device's own "
                                                                 "kernel-to-kernel overhead, added to every op the "
                                                                 "profile prices")
    queued_samples: int = Field(0, ge=0)
    host_interval_s: float | None = Field(None, ge=0, description="interval between consecutive kernel launches "
                                                                    "of one CPU thread in the profiled steps "
                                                                    "(host_interval_statistic): the host's pace, "
                                                                    "priced as training.host_launch_interval is "
                                                                    "without a profile")
    host_interval_samples: int = Field(0, ge=0)
    host_interval_forward_s: float | None = Field(None, ge=0, description="the same over the threads that ran "
                                                                            "forwards (Python, module by module)")
    host_interval_backward_s: float | None = Field(None, ge=0, description="the same over the autograd engine's "
                                                                             "threads, which run backwards")
    host_interval_statistic: str = Field(
        "median", description="how the intervals make the pace: their mean inside the trace's annotated passes "
                              "(the sum a pass costs), or, without pass annotations, their median over every "
                              "interval (waits between passes cannot be told apart; mpsim/traces/host.py); per "
                              "pass kind where the two kinds differ")


class ComputeProfile(_Strict):
    """Everything measured about compute ops, in one dtype."""

    dtype: str
    gemm_points: list[GemmPoint] = Field(default_factory=list)
    gemm_curve: GemmCurve | None = Field(None, description="absent: GEMMs from gemm_fits, else the datasheet")
    gemm_fits: list[GemmShapeFit] = Field(default_factory=list, description="fitted on trace kernels, one per dtype")
    attention_points: list[AttentionPoint] = Field(default_factory=list)
    attention_curve: AttentionCurve | None = Field(None, description="absent: attention from the datasheet")
    memory_points: list[MemoryPoint] = Field(default_factory=list)
    memory_fit: StreamFit | None = Field(None, description="over every memory-bound op measured: the streaming "
                                                             "bandwidth; absent: the datasheet's")
    memory_by_name: dict[str, StreamFit] = Field(default_factory=dict, description="per op name")
    split_backward: SplitBackward | None = Field(None, description="what a deferred weight gradient costs in the "
                                                                   "framework; absent: as its ops")
    launch: LaunchGaps | None = Field(None, description="gaps between kernels seen in a trace")


class SizePoint(Measured):
    """A transfer or collective of ``bytes`` (nccl-tests sizes)."""

    bytes: float = Field(gt=0)


class LinkFit(StreamFit):
    """Alpha-beta fit of a transfer and the points it was fitted to."""

    points: list[SizePoint] = Field(default_factory=list)


class CollectiveFit(LinkFit):
    """Alpha-beta fit of one collective on a group of ``ranks``."""

    kind: Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast", "reduce"]
    bandwidth: float | None = Field(None, gt=0, description="bytes/s; null when the time did not grow with size "
                                                            "over the sizes seen: the line is its latency")
    ranks: int | None = Field(None, ge=2, description="group size; null when the trace did not record it (such a fit "
                                                "prices nothing, it documents what was seen)")
    algorithm: str | None = Field(None, description="NCCL algorithm the kernels ran (RING, TREE, ...), from a trace")
    protocol: str | None = Field(None, description="NCCL protocol (LL, LL128, SIMPLE), from a trace")
    kernels: int = Field(0, ge=0, description="trace kernels fitted (0: microbenchmark points)")

    def seconds(self, message_bytes: float) -> float:
        return self.latency_s + (message_bytes / self.bandwidth if self.bandwidth is not None else 0.0)


class LinksProfile(_Strict):
    """Point-to-point and collective costs between ranks of this machine."""

    backend: str = Field(description="torch.distributed backend measured: gloo or nccl")
    p2p: LinkFit | None = Field(None, description="absent (a trace without sized sends): sends from the datasheet")
    collectives: list[CollectiveFit] = Field(default_factory=list)


class DeviceInfo(_Strict):
    """What was measured."""

    kind: Literal["cpu", "cuda"]
    name: str
    # a profile fitted from a trace knows the device but not the host that ran it: these are null there
    cores: int | None = Field(None, ge=1, description="CPU cores available to the job")
    ranks: int | None = Field(None, ge=1, description="processes that ran at once")
    threads_per_rank: int | None = Field(None, ge=1)
    torch: str | None = None
    python: str | None = None
    platform: str | None = None
    compute_units: int | None = Field(None, ge=1, description="SMs the trace's device reported")


class Conditions(_Strict):
    """How quiet the machine was while it was measured."""

    load_average_before: list[float] | None = None
    load_average_after: list[float] | None = None
    foreign_cpu_share: float | None = Field(
        None, description="share of all CPU time that other processes used during the measurements (0-1)")
    canary_slowdown: float | None = Field(
        None, description="worst slowdown of the speed canary (a fixed small GEMM) against the fastest it ran in "
                          "the job while a kept number was measured: about 1.0 means the machine kept its speed")
    busy: bool = Field(False, description="true when other processes took more than the limit: numbers are suspect")
    environment: dict[str, str] = Field(default_factory=dict,
                                        description="allocator and thread settings of the workers")


class ActionFit(_Strict):
    """Fitted on a real training job: ``action_s = sum(op_s) / efficiency_multiplier + action_overhead_s``."""

    fitted_on: str = Field(description="the schedule whose measured actions were fitted")
    efficiency_multiplier: float = Field(gt=0, description="in-job speed of the ops over their microbenchmark speed")
    action_overhead_s: float = Field(ge=0, description="fixed cost per action: the framework's time between two "
                                                         "actions that is not spent waiting for input")
    rms_error_pct: float = Field(0.0, ge=0, description="of the per-action fit on its schedule")


class HeldOutError(_Strict):
    """Absolute relative error of predicted kernel times on kernels the fit never saw."""

    kernels: int = Field(ge=0)
    shapes: int = Field(ge=0, description="distinct shapes (GEMMs) or sizes (collectives) among them")
    before_median_pct: float | None = Field(None, ge=0, description="datasheet model only")
    before_max_pct: float | None = Field(None, ge=0)
    after_median_pct: float | None = Field(None, ge=0, description="with the fitted profile")
    after_max_pct: float | None = Field(None, ge=0)
    # GEMMs: the kernels that ran alone, and those another stream's kernels ran beside (priced with the
    # slowdown of compute beside a collective; the fit never saw either)
    alone_kernels: int = Field(0, ge=0, description="of them, kernels no other stream's kernel ran beside")
    alone_after_median_pct: float | None = Field(None, ge=0, description="with the fitted profile, on those")
    beside_kernels: int = Field(0, ge=0, description="of them, kernels other streams' kernels ran beside")
    beside_after_median_pct: float | None = Field(None, ge=0, description="with the fitted profile, on those")


class TraceFitInfo(_Strict):
    """Where a profile fitted from traces came from, and how well it predicts what it did not see."""

    traces: list[str] = Field(description="trace files as they were named")
    system: str = Field(description="system whose accelerator priced the datasheet model")
    accelerator: str
    held_out: str = Field(description="the rule that chose the held-out kernels")
    gemm: HeldOutError
    collectives: HeldOutError
    skipped: dict[str, int] = Field(default_factory=dict, description="kernels not used, by reason")
    peer_waits_taken_out: int = Field(0, ge=0, description="collective kernels timed from the last rank's start, "
                                                           "where the traces of every rank of their group show them")
    peer_waits_kept: dict[str, int] = Field(default_factory=dict, description="collective kernels timed as they ran, "
                                                                              "their wait for peers included, by reason")


class CalibrationProfile(_Strict):
    """A calibration profile file (``docs/calibration.md``)."""

    format: Literal["mpsim-calibration/1"] = FORMAT
    source: Literal["measurement", "trace"] = Field("measurement", description="measured by mpsim's own benchmarks, "
                                                                                  "or fitted from profiler traces")
    description: str = ""
    created: str = Field("", description="UTC time of the measurement, ISO 8601")
    device: DeviceInfo
    conditions: Conditions = Field(default_factory=Conditions)
    compute: ComputeProfile
    links: LinksProfile | None = None
    fit: ActionFit | None = None
    trace_fit: TraceFitInfo | None = None


def write_profile(profile: CalibrationProfile, path: str | Path) -> None:
    """Write a profile as YAML (or JSON when the name ends in .json)."""
    # exclude_none keeps a trace profile free of the host fields it cannot know; every
    # optional field defaults to None, so the file reads back the same
    data = profile.model_dump(mode="json", exclude_none=True)
    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps(data, indent=1) + "\n")
        return
    header = ("# mpsim calibration profile (format mpsim-calibration/1, see docs/calibration.md).\n"
              "# Written by `mpsim calibrate` / `mpsim validate`; name it from a scenario as `calibration: FILE`.\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
