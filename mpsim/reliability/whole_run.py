"""A step's distribution and a run's expected length, the way ``mpsim run`` and ``mpsim plan`` ask for them.

Both commands take the same options (``--samples N --seed S`` for the step-time
distribution, ``--tokens T`` for the time to train with failures): this is the one place
that turns a simulated step and those options into the two reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.errors import InputError
from mpsim.simulate import SimulationResult


@dataclass(frozen=True)
class WholeRun:
    """What was asked for: the step-time distribution and/or the expected run (else None)."""

    step_distribution: object | None = None  # mpsim.reliability.report.StepDistribution
    goodput: object | None = None  # mpsim.reliability.goodput.GoodputReport


def whole_run(result: SimulationResult, samples: int | None, seed: int | None, tokens: float | None) -> WholeRun:
    """Sample the step (``samples`` draws with ``seed``, the job's step the slowest of its DP
    replicas) and/or price the run of ``tokens`` tokens, whose step is then the job's mean."""
    distribution = run = None
    step_time_s = None
    if samples is not None:
        from mpsim.reliability.op_variation import op_cvs
        from mpsim.reliability.report import step_distribution
        from mpsim.reliability.sampling import sample_replica

        cv = op_cvs(result.scenario)
        if samples < 2 and any(value > 0 for value in cv.values()):
            raise InputError("needs at least 2 samples to estimate a varying distribution", field="--samples")
        distribution = step_distribution(sample_replica(result, cv, samples, 0 if seed is None else seed),
                                         result.layout.dp)
        step_time_s = distribution.job.mean_s
    if tokens is not None:
        from mpsim.reliability.goodput import goodput

        run = goodput(result, tokens, step_time_s)
    return WholeRun(distribution, run)
