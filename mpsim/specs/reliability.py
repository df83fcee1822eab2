"""Optional scenario blocks for run-to-run variation and for failures over a whole training run.

``variability`` gives the coefficient of variation (standard deviation over mean) of the
time of each kind of op; ``reliability`` gives what a run's expected length depends on
besides its step: how fast checkpoints are written and read, how long a restart takes,
the failure rates (when not the published ones) and, if fixed, the checkpoint interval.
Neither block changes the simulated step; docs/reliability.md says how they are used.
"""

from __future__ import annotations

from pydantic import Field

from mpsim.specs.base import Spec
from mpsim.units import Bandwidth, Seconds


class OpVariation(Spec):
    """Coefficient of variation of op times, per op kind; None: not given (taken from the
    accelerator's published figures where there are any, else asked for)."""

    gemm: float | None = Field(None, ge=0.0, le=10.0, description="matrix multiplications")
    attention: float | None = Field(None, ge=0.0, le=10.0, description="attention kernels")
    memory: float | None = Field(None, ge=0.0, le=10.0, description="memory-bound kernels")
    collective: float | None = Field(None, ge=0.0, le=10.0,
                                     description="collectives (TP/CP/EP inside actions, DP gradient reductions)")
    transfer: float | None = Field(None, ge=0.0, le=10.0, description="pipeline sends between stages")


class VariabilitySpec(Spec):
    """Run-to-run variation of op times (``mpsim run --samples``)."""

    cv: OpVariation = Field(default_factory=OpVariation,
                            description="coefficient of variation (std / mean) of each op kind's time")


class FailureRates(Spec):
    """Interruptions per component-hour; None: the published rate (mpsim/reliability/failures.py)."""

    gpu: float | None = Field(None, ge=0.0, le=1.0, description="per accelerator-hour")
    host: float | None = Field(None, ge=0.0, le=1.0, description="per node-hour (CPU, memory, SSD, power, ...)")
    nic: float | None = Field(None, ge=0.0, le=1.0, description="per accelerator-hour (one NIC per accelerator)")
    switch: float | None = Field(None, ge=0.0, le=1.0, description="network switches and cables, per accelerator-hour")
    software: float | None = Field(None, ge=0.0, le=1.0,
                                   description="software bugs, collective timeouts, dependencies, per accelerator-hour")


class ReliabilitySpec(Spec):
    """What the expected length of a whole run depends on (``mpsim run --goodput``)."""

    storage_bandwidth: Bandwidth | None = Field(
        None, gt=0, description="aggregate bandwidth at which the whole job writes and reads a checkpoint")
    restart_time: Seconds | None = Field(
        None, ge=0, description="from an interruption until training runs again, without loading the checkpoint")
    checkpoint_interval: Seconds | None = Field(
        None, gt=0, description="training time between checkpoints; absent: Daly's optimum")
    failure_rates: FailureRates = Field(default_factory=FailureRates,
                                        description="interruptions per component-hour by cause")
