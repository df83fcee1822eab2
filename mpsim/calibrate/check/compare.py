"""Predicted against measured: the fit on one schedule and the check on the others.

1. **Fit.** With the microbenchmark profile alone, mpsim prices every action of the fit
   schedule (1F1B) as a sum of measured ops. Against the same actions timed inside the
   job, ``measured = predicted / efficiency_multiplier`` is fitted (least squares
   through the origin, ``mpsim/calibrate/fit/fitting.py`` says why). The per-action
   overhead is the framework's time between two actions of a rank that is not spent
   waiting for input (Python, posting sends and receives), the median over the fit
   schedule's steps.
2. **Check.** The profile with the fit is simulated under every schedule (same
   scenario, ``parallel.schedule`` and ``vpp`` set for each) and each one's pipeline
   time and action durations are compared with the median measured step.

PyTorch runs the first stage's whole backward in its ``W`` (the first stage has no
input gradient to produce, so its ``I`` is empty) where mpsim splits it into an input
and a weight half; per-action errors therefore compare that stage's ``I`` and ``W`` of a
microbatch as one ``I+W`` pair. Step times are unaffected: the two run back to back.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import NamedTuple

from mpsim.calibrate.fit.fitting import fit_actions
from mpsim.calibrate.check.measured import (MeasuredStep, framework_gaps, item_duration, median_step, order_mismatch)
from mpsim.specs.calibration import ActionFit, CalibrationProfile
from mpsim.schedules.actions import Overlapped
from mpsim.simulate import SimulationResult, simulate
from mpsim.specs.scenario import Scenario

# sensible ranges for the fitted parameters: ops in the job run at about their
# microbenchmark speed, and a framework's fixed cost per action is well under 5 ms
MULTIPLIER_RANGE = (0.75, 1.25)
OVERHEAD_RANGE_S = (0.0, 5e-3)


def with_profile(scenario: Scenario, profile: CalibrationProfile) -> Scenario:
    return scenario.model_copy(update={"calibration": profile})


def _label(item) -> str:
    return str(item)


def _action_pairs(result: SimulationResult, steps: list[MeasuredStep]):
    """(rank, label, kind, predicted s, measured median s) for every action of the schedule."""
    schedule = result.schedule
    first = 0
    for rank, records in enumerate(result.timeline.actions):
        pending: dict[int, tuple[float, list[float]]] = {}  # microbatch -> first stage's I, waiting for its W
        for record in records:
            item = record.action
            durations = [d for d in (item_duration(s, rank, item) for s in steps) if d is not None]
            if len(durations) != len(steps):
                continue
            predicted = record.end_s - record.start_s
            if not isinstance(item, Overlapped) and item.stage == first and item.kind in ("I", "W") \
                    and schedule.split_backward:
                mb = item.microbatch
                if item.kind == "I":
                    pending[mb] = (predicted, durations)
                    continue
                if mb in pending:
                    p_i, d_i = pending.pop(mb)
                    yield rank, f"{first}I+W{mb}", "I+W", p_i + predicted, statistics.median(
                        a + b for a, b in zip(d_i, durations))
                    continue
            kind = "F&B" if isinstance(item, Overlapped) else item.kind
            yield rank, _label(item), kind, predicted, statistics.median(durations)


def fit_profile(profile: CalibrationProfile, scenario: Scenario, steps: list[MeasuredStep],
                schedule_name: str) -> tuple[ActionFit, SimulationResult]:
    """Fit the multiplier and overhead on ``steps`` of ``scenario`` (whose schedule is ``schedule_name``)."""
    unfitted = with_profile(scenario, profile.model_copy(update={"fit": None}))
    result = simulate(unfitted)
    pairs = list(_action_pairs(result, steps))
    fitted = fit_actions([p for *_, p, _ in pairs], [m for *_, m in pairs])
    gap_s = statistics.median(framework_gaps(steps)) if steps else 0.0
    fit = ActionFit(fitted_on=schedule_name, efficiency_multiplier=fitted.efficiency_multiplier,
                    action_overhead_s=gap_s, rms_error_pct=fitted.rms_error_pct)
    return fit, result


def fit_in_range(fit: ActionFit) -> list[str]:
    """Problems with the fitted parameters (empty when both are in their sensible ranges)."""
    problems = []
    low, high = MULTIPLIER_RANGE
    if not low <= fit.efficiency_multiplier <= high:
        problems.append(f"efficiency multiplier {fit.efficiency_multiplier:.3f} outside [{low}, {high}]")
    low, high = OVERHEAD_RANGE_S
    if not low <= fit.action_overhead_s <= high:
        problems.append(f"action overhead {fit.action_overhead_s * 1e3:.2f} ms outside "
                        f"[{low * 1e3:.0f}, {high * 1e3:.0f}] ms")
    return problems


@dataclass
class ActionError:
    rank: int
    label: str
    kind: str
    predicted_s: float
    measured_s: float

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_s - self.measured_s) / self.measured_s


class RankMiss(NamedTuple):
    """Measured minus predicted, seconds, of one rank's step: where a step-time error lies."""

    actions_s: float  # the rank's actions, summed
    receive_waits_s: float  # blocked waiting for an input from another rank
    rest_s: float  # the rest of the time to its last action's end


@dataclass
class ScheduleCheck:
    """One schedule: measured against predicted."""

    name: str
    vpp: int
    held_out: bool
    steps: list[MeasuredStep]
    attempts: int
    result: SimulationResult
    actions: list[ActionError] = field(default_factory=list)
    order_problem: str | None = None

    @property
    def measured_step_s(self) -> float:
        return statistics.median(s.step_s for s in self.steps)

    @property
    def measured_spread(self) -> float:
        """(max - min) / median of the kept steps."""
        times = [s.step_s for s in self.steps]
        return (max(times) - min(times)) / statistics.median(times)

    @property
    def median_excess(self) -> float:
        """(median - fastest) / fastest of the kept steps: how far noise may have lengthened the median.

        Noise only ever lengthens a step, so the fastest kept step is the closest to what
        the machine does undisturbed; an error within this is within the measurement's noise.
        """
        fastest = min(s.step_s for s in self.steps)
        return (self.measured_step_s - fastest) / fastest

    @property
    def predicted_step_s(self) -> float:
        return self.result.timeline.pipeline_end_s

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def max_foreign_share(self) -> float:
        return max(s.foreign_cpu_share for s in self.steps)

    @property
    def max_slowdown(self) -> float:
        return max(s.slowdown for s in self.steps)

    @property
    def disturbed_steps(self) -> int:
        """Kept steps none of whose tries was quiet (only with ``--allow-busy``)."""
        return sum(s.disturbed for s in self.steps)

    def miss_by_rank(self) -> list[RankMiss]:
        """Per rank, where the measured time to its last action's end differs from the predicted:
        inside its actions, in its waits for a receive, and in the rest (framework time between
        actions, own sends, waiting to start). Measured figures are medians over the kept steps;
        the rest is what the end leaves of each side's actions and waits, so the three add up to
        the difference of the ends."""
        misses = []
        for rank, records in enumerate(self.result.timeline.actions):
            end = statistics.median(max((a.end_s for a in s.actions[rank]), default=0.0) for s in self.steps)
            busy = statistics.median(sum(a.duration_s for a in s.actions[rank]) for s in self.steps)
            waits = statistics.median(sum(e - b for b, e in s.waits[rank]) for s in self.steps)
            predicted_end = records[-1].end_s if records else 0.0
            predicted_busy = sum(r.end_s - r.start_s for r in records)
            predicted_waits = sum(r.start_s - r.ready_s for r in records)
            misses.append(RankMiss(busy - predicted_busy, waits - predicted_waits,
                                   (end - busy - waits) - (predicted_end - predicted_busy - predicted_waits)))
        return misses

    def action_error_summary(self) -> tuple[float, float]:
        """(median, max) absolute per-action error in percent."""
        errors = [abs(a.error_pct) for a in self.actions]
        return (statistics.median(errors), max(errors)) if errors else (0.0, 0.0)


def check_schedule(name: str, scenario: Scenario, profile: CalibrationProfile, steps: list[MeasuredStep],
                   attempts: int, held_out: bool) -> ScheduleCheck:
    """Simulate ``scenario`` with the fitted profile and line it up with its measured steps."""
    result = simulate(with_profile(scenario, profile))
    check = ScheduleCheck(name, scenario.parallel.vpp, held_out, steps, attempts, result)
    check.actions = [ActionError(*pair) for pair in _action_pairs(result, steps)]
    check.order_problem = order_mismatch(median_step(steps), result.schedule)
    return check


def step_errors(checks: list[ScheduleCheck]) -> tuple[float, float, int]:
    """(median, max) absolute step-time error in percent over the held-out schedules, and their count."""
    errors = [abs(c.error_pct) for c in checks if c.held_out]
    if not errors:
        return 0.0, 0.0, 0
    return statistics.median(errors), max(errors), len(errors)
