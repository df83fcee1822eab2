"""The step-time distribution and the run's expected length as text and as JSON fields.

The distribution: one replica's samples (what the simulation re-ran) and the job's step,
the slowest of the ``dp`` replicas drawn from the replica distribution's order
statistics (``order_stats.py``). The run: the goodput of ``goodput.py``. Field names and
meanings are in docs/json.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpsim.reliability.goodput import SECONDS_PER_DAY, GoodputReport
from mpsim.reliability.order_stats import Percentiles, Spliced, max_of_replicas, replica_distribution
from mpsim.reliability.sampling import ReplicaSamples
from mpsim.units import format_bytes, format_seconds

# draws of the job's step from the order statistics: cheap (no simulation), so many,
# which keeps the p99 of the maximum steady
JOB_DRAWS = 20_000


@dataclass(frozen=True)
class StepDistribution:
    """Step times of one replica and of the whole job (the slowest of ``replicas``)."""

    samples: int
    seed: int
    cv: dict[str, float]
    replicas: int
    replica: Percentiles
    job: Percentiles
    replica_step_time_s: tuple[float, ...]
    job_step_time_s: np.ndarray
    fit: str  # how the replica distribution was estimated


def step_distribution(samples: ReplicaSamples, replicas: int) -> StepDistribution:
    """The distribution of one replica's samples and of the slowest of ``replicas`` of them."""
    values = np.asarray(samples.step_time_s, dtype=float)
    distribution = replica_distribution(values)
    # a stream of its own, so the job's draws do not shift when the replica draws change in number
    rng = np.random.default_rng([samples.seed, 1])
    # one replica's job is that replica: its samples themselves, not draws again from them
    job = values if replicas == 1 else max_of_replicas(distribution, replicas, JOB_DRAWS, rng)
    if isinstance(distribution, Spliced):
        fit = (f"the samples, a lognormal tail beyond the largest (log-mean {distribution.tail_fit.mu:.6g}, "
               f"log-sd {distribution.tail_fit.sigma:.6g})")
    else:
        fit = "point mass (no variation)"
    return StepDistribution(len(values), samples.seed, samples.cv, replicas, Percentiles.of(values),
                            Percentiles.of(job), samples.step_time_s, job, fit)


def distribution_dict(d: StepDistribution) -> dict:
    return {"samples": d.samples, "seed": d.seed, "cv": dict(d.cv), "replicas": d.replicas,
            "replica_fit": d.fit, "job_draws": len(d.job_step_time_s),
            "replica": d.replica.as_dict(), "job": d.job.as_dict()}


def format_distribution(d: StepDistribution) -> str:
    cv = ", ".join(f"{kind} {value:g}" for kind, value in d.cv.items())
    lines = [f"step-time distribution ({d.samples} samples, seed {d.seed}; cv: {cv})"]
    for label, p in (("  one replica", d.replica), (f"  job (max of {d.replicas})", d.job)):
        lines.append(f"{label:<20} mean {format_seconds(p.mean_s)}  p50 {format_seconds(p.p50_s)}  "
                     f"p90 {format_seconds(p.p90_s)}  p99 {format_seconds(p.p99_s)}")
    lines.append(f"  replica fit        {d.fit}")
    return "\n".join(lines)


def _finite(value: float) -> float | None:
    """JSON has no infinity: a job without failures has no MTBF and no optimal interval (null)."""
    return value if math.isfinite(value) else None


def goodput_dict(g: GoodputReport) -> dict:
    run = g.run
    return {
        "tokens": g.tokens, "unit": g.unit, "steps": g.steps, "step_time_s": g.step_time_s,
        "checkpoint_bytes": g.checkpoint_bytes, "storage_bandwidth_bytes_per_s": g.storage_bandwidth_bytes_per_s,
        "checkpoint_write_s": g.checkpoint_write_s, "checkpoint_load_s": g.checkpoint_load_s,
        "restart_time_s": g.restart_time_s, "mtbf_s": _finite(g.failures.mtbf_s),
        "interruptions_per_day": g.interruptions_per_day,
        "interruptions_per_day_by_component": {c: rate * 24.0 for c, rate in g.failures.per_hour.items()},
        "failure_rate_sources": dict(g.failures.sources),
        "checkpoint_interval_s": _finite(run.interval_s), "young_interval_s": _finite(g.young_interval_s),
        "expected_interruptions": run.interruptions,
        "wall_time_s": run.wall_s, "wall_time_days": g.days, "effective_training_time": run.effective_fraction,
        "lost_s": {"checkpoint_writes": run.checkpoint_s, "lost_work": run.lost_work_s, "restarts": run.restart_s},
    }


def format_goodput(g: GoodputReport) -> str:
    run = g.run
    lost = run.wall_s - run.training_s

    def share(seconds: float) -> str:
        return f"{seconds / SECONDS_PER_DAY:.2f} days ({seconds / lost:.0%} of lost)" if lost > 0 else "0 days"

    by = ", ".join(f"{c} {rate * 24:.2f}" for c, rate in g.failures.per_hour.items())
    return "\n".join([
        f"time to train {g.tokens:.4g} {g.unit} ({g.steps} steps of {format_seconds(g.step_time_s)})",
        f"  expected wall time {g.days:.2f} days; effective training time {run.effective_fraction:.1%}",
        f"  interruptions      {g.interruptions_per_day:.2f} a day ({by}); MTBF {g.failures.mtbf_s / 3600:.2f} h; "
        f"{run.interruptions:.0f} over the run",
        f"  checkpoint         {format_bytes(g.checkpoint_bytes)}: write {format_seconds(g.checkpoint_write_s)}, "
        f"load {format_seconds(g.checkpoint_load_s)}; every {format_seconds(run.interval_s)} of training "
        f"(Young: {format_seconds(g.young_interval_s)})",
        f"  lost time          checkpoint writes {share(run.checkpoint_s)}, lost work {share(run.lost_work_s)}, "
        f"restarts {share(run.restart_s)}",
    ])
