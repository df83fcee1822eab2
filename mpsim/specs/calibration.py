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


class ComputeProfile(_Strict):
    """Everything measured about compute ops, in one dtype."""

    dtype: str
    gemm_points: list[GemmPoint] = Field(default_factory=list)
    gemm_curve: GemmCurve
    attention_points: list[AttentionPoint] = Field(default_factory=list)
    attention_curve: AttentionCurve
    memory_points: list[MemoryPoint] = Field(default_factory=list)
    memory_fit: StreamFit = Field(description="over every memory-bound op measured: the streaming bandwidth")
    memory_by_name: dict[str, StreamFit] = Field(default_factory=dict, description="per op name")
    split_backward: SplitBackward | None = Field(None, description="what a deferred weight gradient costs in the "
                                                                   "framework; absent: as its ops")


class SizePoint(Measured):
    """A transfer or collective of ``bytes`` (nccl-tests sizes)."""

    bytes: float = Field(gt=0)


class LinkFit(StreamFit):
    """Alpha-beta fit of a transfer and the points it was fitted to."""

    points: list[SizePoint] = Field(default_factory=list)


class CollectiveFit(LinkFit):
    """Alpha-beta fit of one collective on a group of ``ranks``."""

    kind: Literal["all-reduce", "all-gather", "reduce-scatter"]
    ranks: int = Field(ge=2)


class LinksProfile(_Strict):
    """Point-to-point and collective costs between ranks of this machine."""

    backend: str = Field(description="torch.distributed backend measured: gloo or nccl")
    p2p: LinkFit
    collectives: list[CollectiveFit] = Field(default_factory=list)


class DeviceInfo(_Strict):
    """What was measured."""

    kind: Literal["cpu", "cuda"]
    name: str
    cores: int = Field(ge=1, description="CPU cores available to the job")
    ranks: int = Field(ge=1, description="processes that ran at once")
    threads_per_rank: int = Field(ge=1)
    torch: str
    python: str
    platform: str


class Conditions(_Strict):
    """How quiet the machine was while it was measured."""

    load_average_before: list[float] | None = None
    load_average_after: list[float] | None = None
    foreign_cpu_share: float | None = Field(
        None, description="share of all CPU time that other processes used during the measurements (0-1)")
    canary_slowdown: float | None = Field(
        None, description="worst slowdown of the speed canary (a fixed small GEMM) against its time at the start of "
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


class CalibrationProfile(_Strict):
    """A calibration profile file (``docs/calibration.md``)."""

    format: Literal["mpsim-calibration/1"] = FORMAT
    description: str = ""
    created: str = Field("", description="UTC time of the measurement, ISO 8601")
    device: DeviceInfo
    conditions: Conditions = Field(default_factory=Conditions)
    compute: ComputeProfile
    links: LinksProfile | None = None
    fit: ActionFit | None = None


def write_profile(profile: CalibrationProfile, path: str | Path) -> None:
    """Write a profile as YAML (or JSON when the name ends in .json)."""
    data = profile.model_dump(mode="json")
    path = Path(path)
    if path.suffix == ".json":
        path.write_text(json.dumps(data, indent=1) + "\n")
        return
    header = ("# mpsim calibration profile (format mpsim-calibration/1, see docs/calibration.md).\n"
              "# Written by `mpsim calibrate` / `mpsim validate`; name it from a scenario as `calibration: FILE`.\n")
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))
