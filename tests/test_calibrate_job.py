"""The real thing: calibrate and validate on this machine with PyTorch (2 ranks x 1 thread).

One measurement job (module fixture, two and a half minutes on 2 cores): the validation
scenario's ops and links, GPipe, 1F1B, interleaved 1F1B, ZB-V and DualPipeV with 7
measured steps each, and the DTensor MLP check. Seven rather than five because a
zero-bubble schedule has no idle time to absorb an action the machine slowed: its
steps scatter the most (up to 35 % here), and its median needs the extra steps.
Skipped without torch (CI installs it).

The profile is fitted on 1F1B only; every check of prediction quality is on the other
schedules, which the fit never saw.

A busy machine never skips these tests. The job starts at once (``allow_busy`` skips
the wait before it) and does not pause for quiet inside it: a disturbed measurement is
kept as it is, a step marked, so every schedule yields steps. The profile's conditions
record how noisy the kept measurements were; when noise was over the job's limits the
bounds below are loosened by the amount that noise can move a step, stated in a
warning (``NoisyMeasurementWarning``) that names the measured noise. A held-out step
time is judged by the noise its median and the fit schedule's median can carry (the
median of their steps' gauges, and each median's excess over its fastest step, since
noise only lengthens a step); the other checks by the worst kept measurement. The
canary's slowdowns are against the fastest it ran in the whole job
(``mpsim/calibrate/measure/guard.py``), so a machine that started slow shows it.
"""

from __future__ import annotations

import re
import statistics
import warnings
from dataclasses import dataclass

import pytest

from mpsim.calibrate.measure.jobs import DEFAULT_SCHEDULES, FIT_SCHEDULE, MeasureSettings
from mpsim.calibrate.check.compare import MULTIPLIER_RANGE, OVERHEAD_RANGE_S, fit_in_range
from mpsim.simulate import simulate

torch = pytest.importorskip("torch")

from mpsim.calibrate.measure.guard import SLOWDOWN_LIMIT  # noqa: E402  (imports torch)

# On a quiet machine (other processes under the job's 15 % CPU limit, the speed canary
# within QUIET_CANARY of the fastest it ran in the job) held-out step times land within
# 10 % and the TP speed-up within 3 % (docs/calibration.md); 15 % leaves room for the
# run-to-run drift of a shared virtual machine.
QUIET_HELD_OUT_LIMIT_PCT = 15.0
QUIET_TP_LIMIT_PCT = 15.0
# A canary within this of its fastest time counts as quiet: below it, what a slower core
# can move (1 - 1/c, under 5 %) is inside the margin between the quiet runs' errors and the
# bounds above. The job's own SLOWDOWN_LIMIT (1.25) decides what it measures again; a run
# whose canary stayed just under it was seen here with its fit off by exactly that
# slowdown (multiplier 0.70 at a canary of 1.22, against 0.82-0.86 on quiet runs).
QUIET_CANARY = 1.05

# No pauses for quiet inside the job (allow_busy skips the wait before it). On the 2-core
# virtual machines the suite runs on, the speed canary scatters to 1.25-2x its fastest
# time with other processes under 2 % of the CPU, and 30 s of pauses with their retries
# (45 s in all, a twelfth of the suite) did not bring it back under the job's limit: they
# bought no quieter numbers. What the kept measurements show loosens the bounds instead.
WAIT_BEFORE_S = 60.0
WAIT_INSIDE_S = 0.0
# The whole test suite must stay under 10 minutes; a job that runs past 8 fails the
# tests (JobError) rather than skipping them or running CI out of time.
JOB_TIMEOUT_S = 480.0
# the suite's per-test limit (pyproject.toml) is shorter than the job may take with its waits
# alone: the job times this machine, so the suite's other workers wait while it runs (tests/conftest.py)
pytestmark = [pytest.mark.timeout(JOB_TIMEOUT_S + WAIT_BEFORE_S + WAIT_INSIDE_S + 300), pytest.mark.alone]
STEPS = 7


class NoisyMeasurementWarning(UserWarning):
    """The machine was noisier than the job's limits while it measured: a bound was loosened."""


@dataclass(frozen=True)
class Noise:
    """How noisy the kept measurements were, and how far that noise can move a step time."""

    share: float  # the worst share of the machine's CPU other processes took during a kept measurement
    canary: float  # the worst speed-canary slowdown during a kept measurement
    disturbed_steps: int  # kept training steps none of whose tries was quiet
    limit: float  # the job's foreign CPU share limit

    @property
    def flagged(self) -> bool:
        return self.share > self.limit or self.canary > QUIET_CANARY or self.disturbed_steps > 0

    @property
    def extra_pct(self) -> float:
        """Percentage points the noise beyond the quiet limits can add to a step-time error.

        The quiet bounds already hold for measurements taken with other processes under
        ``limit`` of the CPU and the canary under QUIET_CANARY; only the excess is new.
        Each rank is pinned to a core of its own, and the kernel spreads other processes
        over the cores and shares each core fairly, so other processes taking a share
        ``s`` of the machine take about ``s`` of each rank's core: a measured time (an op,
        a step of the fit schedule, a held-out step) is lengthened by up to ``s - limit``
        of itself beyond what a quiet run allows (were all of it on one rank's core, that
        rank would lose up to ``n`` times as much on ``n`` cores; the kernel's balancing
        makes that a transient, which the medians of steps and op passes leave out). A
        canary at ``c`` times its fastest time says the core itself ran ``c`` times
        slower (a neighbour the kernel cannot see), which lengthens a measured time by
        ``1 - 1 / c`` of it: the microbenchmarks and the training steps are not measured in
        the same minutes, so all of it can land between them. Both together leave
        ``(1 - stolen) * (1 - slowed)`` of it; the rest is how far the measurement, or the
        ops and fit the prediction is built from, can be moved, to first order. The worst
        kept measurement's values are used (the profile's conditions), so the bound holds
        for whichever measurement the noise hit.
        """
        stolen = min(1.0, max(0.0, self.share - self.limit))
        slowed = 1.0 - min(1.0, 1.0 / self.canary)
        return 100.0 * (1.0 - (1.0 - stolen) * (1.0 - slowed))

    def describe(self) -> str:
        return (f"machine noisy while measuring: other processes took up to {100 * self.share:.1f} % of the CPU "
                f"(limit {100 * self.limit:.0f} %), the speed canary ran up to {self.canary:.2f}x its fastest "
                f"time (quiet up to {QUIET_CANARY:.2f}x), {self.disturbed_steps} training step(s) kept although "
                f"disturbed")

    def bound(self, quiet_pct: float, what: str) -> float:
        """The quiet bound, loosened by the noise when it was flagged (with a warning that says so)."""
        return joint_bound([self], quiet_pct, what)

    def widen(self, low: float, high: float, what: str) -> tuple[float, float]:
        """A quiet range for a measured time or a ratio of two, widened by the noise when it was flagged.

        A measured time may be lengthened by ``extra_pct`` of itself (see there), so it,
        or a ratio of two of them, may move by a factor ``1 - extra`` either way.
        """
        if not self.flagged:
            return low, high
        keep = 1.0 - self.extra_pct / 100.0  # over 0: a share is at most 1 and the canary finite
        wide = (low * keep, high / keep)
        warnings.warn(NoisyMeasurementWarning(
            f"{self.describe()}; {what} range widened from {low:g}-{high:g} to {wide[0]:.3g}-{wide[1]:.3g}"))
        return wide


def joint_bound(noises: list[Noise], quiet_pct: float, what: str) -> float:
    """The quiet bound, loosened by what all of ``noises`` together can move a step (with a warning).

    Each measurement keeps ``1 - extra`` of its time at worst, so a prediction built on one
    and compared with another can be off by ``1 - prod(1 - extra)`` beyond a quiet run.
    """
    flagged = [noise for noise in noises if noise.flagged]
    if not flagged:
        return quiet_pct
    keep = 1.0
    for noise in flagged:
        keep *= 1.0 - noise.extra_pct / 100.0
    loose = quiet_pct + 100.0 * (1.0 - keep)
    warnings.warn(NoisyMeasurementWarning(
        f"{'; '.join(noise.describe() for noise in flagged)}; {what} bound loosened from {quiet_pct:.0f} % to "
        f"{loose:.1f} %"))
    return loose


def median_step_noise(check, limit: float) -> Noise:
    """The noise that can move a schedule's median step: the median of its kept steps' gauges.

    A step time is the median of the kept steps. Noise only lengthens a step, so when at
    most half the steps were slowed by more than ``x`` the median is lengthened by at most
    ``x``: the median of each gauge over the steps bounds it, where the worst step (the
    profile's conditions) would charge every schedule for one round a neighbour spoiled.
    """
    middle = len(check.steps) // 2
    share = sorted(step.foreign_cpu_share for step in check.steps)[middle]
    canary = sorted(step.slowdown for step in check.steps)[middle]
    return Noise(share=share, canary=canary, disturbed_steps=0, limit=limit)


PROGRESS: list[str] = []  # what the job reported while it ran


@pytest.fixture(scope="module")
def outcome():
    from mpsim.calibrate.runner import validate

    settings = MeasureSettings(warmup_steps=1, steps=STEPS, link_repeats=15, tp_repeats=15, wait_budget_s=WAIT_INSIDE_S)
    return validate("cpu", list(DEFAULT_SCHEDULES), settings, wait_s=WAIT_BEFORE_S, allow_busy=True,
                    timeout_s=JOB_TIMEOUT_S, say=PROGRESS.append)


@pytest.fixture(scope="module")
def noise(outcome):
    conditions = outcome.profile.conditions
    return Noise(share=conditions.foreign_cpu_share or 0.0, canary=conditions.canary_slowdown or 1.0,
                 disturbed_steps=sum(check.disturbed_steps for check in outcome.checks),
                 limit=MeasureSettings().foreign_limit)


def _held_out(outcome) -> list:
    held_out = [check for check in outcome.checks if check.held_out]
    assert FIT_SCHEDULE not in {check.name for check in held_out}
    assert len(held_out) == len(DEFAULT_SCHEDULES) - 1, outcome.skipped
    return held_out


def test_every_schedule_ran_in_mpsims_order(outcome):
    # with allow_busy a busy machine still yields steps for every schedule: nothing may be missing
    ran = {check.name for check in outcome.checks}
    assert ran == set(DEFAULT_SCHEDULES), outcome.skipped
    assert not outcome.skipped
    for check in outcome.checks:
        assert len(check.steps) == STEPS, f"{check.name}: {len(check.steps)} steps kept of {check.attempts} tries"
        assert check.order_problem is None, f"{check.name}: {check.order_problem}"


def test_disturbed_steps_are_flagged_in_the_profile_and_the_report(outcome, noise):
    from mpsim.calibrate.check.report import format_validation

    report = format_validation(outcome)
    for check in outcome.checks:
        for step in check.steps:
            if step.disturbed:  # kept although over a limit: the profile's worst-case conditions must show it
                assert step.foreign_cpu_share > noise.limit or step.slowdown > SLOWDOWN_LIMIT, check.name
                assert step.foreign_cpu_share <= noise.share and step.slowdown <= noise.canary, check.name
        assert (f"{check.disturbed_steps} of the kept steps were measured while the machine was disturbed"
                in report) == (check.disturbed_steps > 0), check.name
    assert outcome.profile.conditions.busy == (noise.share > noise.limit)
    assert ("BUSY: numbers suspect" in report) == outcome.profile.conditions.busy


def test_held_out_schedules_are_predicted_within_the_bound(outcome, noise):
    # A held-out prediction rests on the fit schedule's steps (the multiplier, the overhead)
    # and is compared with the held-out schedule's steps: the noise of both medians counts,
    # as the gauges saw it (median_step_noise) and as the steps themselves show it. Noise
    # that lengthened the held-out median makes the prediction look fast (a negative
    # error) by up to that median's excess over its fastest step; noise that lengthened
    # the fit schedule's steps lowered the multiplier and makes every prediction slow (a
    # positive error) by up to the fit schedule's excess.
    fit_check = next(c for c in outcome.checks if c.name == FIT_SCHEDULE)
    fit_noise = median_step_noise(fit_check, noise.limit)
    failures = []
    for check in _held_out(outcome):
        limit = joint_bound([median_step_noise(check, noise.limit), fit_noise], QUIET_HELD_OUT_LIMIT_PCT,
                            f"{check.name} step-time")
        fast_limit, slow_limit = limit + 100.0 * check.median_excess, limit + 100.0 * fit_check.median_excess
        if not -fast_limit <= check.error_pct <= slow_limit:
            failures.append(f"{check.name}: predicted {check.predicted_step_s:.3f} s, measured "
                            f"{check.measured_step_s:.3f} s ({check.error_pct:+.1f} %, bound -{fast_limit:.1f} "
                            f"to +{slow_limit:.1f} %; steps {', '.join(f'{s.step_s:.3f}' for s in check.steps)}; "
                            f"{FIT_SCHEDULE} steps {', '.join(f'{s.step_s:.3f}' for s in fit_check.steps)})")
    assert not failures, "; ".join(failures)


def test_fitted_parameters_are_in_sensible_ranges(outcome, noise):
    fit = outcome.fit
    assert fit.fitted_on == FIT_SCHEDULE
    assert fit_in_range(fit) == [] or noise.flagged, fit  # the ranges mpsim itself checks, on a quiet machine
    # the multiplier is microbenchmark time over in-job time, the split's slowdown W over (B - I): ratios of
    # measured times, which noise moves either way; the overhead is a measured time, which noise lengthens
    low, high = noise.widen(*MULTIPLIER_RANGE, "efficiency multiplier")
    # and noise that lengthened the fit schedule's steps (its median's excess over its
    # fastest step) lowers the multiplier by as much
    fit_check = next(c for c in outcome.checks if c.name == FIT_SCHEDULE)
    low /= 1.0 + fit_check.median_excess
    assert low <= fit.efficiency_multiplier <= high, (fit, f"low end {low:.3f}")
    low, high = noise.widen(*OVERHEAD_RANGE_S, "action overhead (s)")
    assert low <= fit.action_overhead_s <= high, fit
    split = outcome.profile.compute.split_backward
    assert split is not None and split.samples >= 3
    # a deferred W never runs much faster than inside a full backward
    low, high = noise.widen(0.9, 1.6, "split-backward slowdown")
    assert low <= split.weight_slowdown <= high, split


def test_tp_speedup_is_predicted_within_the_bound_at_every_width(outcome, noise):
    widths = outcome.tp_widths
    assert outcome.tp is widths[0] and outcome.tp.hidden == 512  # the model's own width first
    assert sorted(tp.hidden for tp in widths) == [256, 512, 768]
    for tp in widths:
        assert tp.tp == 2
        assert tp.measured_speedup > 1.0, tp  # two cores on one block do beat one
        assert tp.measured_dtensor_s is not None and tp.measured_dtensor_s > 0
        # the TP check carries its own disturbance; the prediction rests on the profile's ops
        worst = Noise(share=max(noise.share, tp.foreign_cpu_share), canary=max(noise.canary, tp.slowdown),
                      disturbed_steps=noise.disturbed_steps, limit=noise.limit)
        limit = worst.bound(QUIET_TP_LIMIT_PCT, f"TP speed-up at hidden {tp.hidden}")
        assert abs(tp.error_pct) <= limit, (f"hidden {tp.hidden}, bound {limit:.1f} %: measured "
                                            f"{tp.measured_speedup:.3f}, predicted {tp.predicted_speedup:.3f}")


def test_every_phase_reported_its_progress(outcome):
    text = "\n".join(PROGRESS)
    for phase in ("links:", "ops: pass 1 of", f"pipeline: step {STEPS} of {STEPS}", "TP check: shape 3 of 3"):
        assert phase in text, text


def test_measured_profile_round_trips_with_the_same_predictions(outcome, tmp_path):
    from mpsim.specs import load_scenario
    from mpsim.specs.calibration import write_profile

    write_profile(outcome.profile, tmp_path / "measured.yaml")
    # read back the way a scenario naming the file reads it
    again = load_scenario(outcome.plan.path, [f"calibration={tmp_path / 'measured.yaml'}"]).scenario.calibration
    fit_check = next(c for c in outcome.checks if not c.held_out)
    for check in (fit_check, _held_out(outcome)[0]):
        scenario = outcome.plan.variants[check.name]
        before = simulate(scenario.model_copy(update={"calibration": outcome.profile})).timeline.pipeline_end_s
        after = simulate(scenario.model_copy(update={"calibration": again})).timeline.pipeline_end_s
        assert after == before == check.predicted_step_s, check.name


def test_the_profile_moves_held_out_predictions_towards_the_measurements(outcome, noise):
    # Judged on the median over the held-out schedules of the relative errors, not per
    # schedule. The profile reprices every action by nearly the same factor (measured
    # ops, one multiplier, one overhead), so its effect is common to all schedules,
    # while noise moves one schedule's median step on its own (a ZB-V step scatters by
    # up to 35 % on a quiet shared machine): a per-schedule comparison can flip on one
    # noisy schedule, the median of the four only when most of them move.
    held_out = _held_out(outcome)
    datasheet = [(simulate(outcome.plan.variants[c.name]).timeline.pipeline_end_s - c.measured_step_s)
                 / c.measured_step_s for c in held_out]
    calibrated = [c.error_pct / 100 for c in held_out]
    datasheet_error, calibrated_error = statistics.median(datasheet), statistics.median(calibrated)
    detail = (f"median relative error of the datasheet {100 * datasheet_error:+.1f} %, calibrated "
              f"{100 * calibrated_error:+.1f} % over {[c.name for c in held_out]}")
    limit = noise.bound(QUIET_HELD_OUT_LIMIT_PCT, "held-out step-time")
    # How far the placeholder datasheet is off depends on the machine (and on the placeholder
    # numbers). Off by more than the held-out bound, it must lose to the profile; within it,
    # which of two predictions inside the bound is closer is the noise's call, and the
    # profile must only keep the prediction inside the bound.
    if abs(100 * datasheet_error) <= limit:
        warnings.warn(UserWarning(
            f"the datasheet is already within the {limit:.1f} % bound on this machine ({detail}): checked only "
            f"that the profile keeps the prediction within it"))
        assert abs(100 * calibrated_error) <= limit, detail
        return
    # the measurements say which way the datasheet is off, and the profile goes that way
    assert (calibrated_error > datasheet_error) == (datasheet_error < 0), detail
    assert abs(calibrated_error) < abs(datasheet_error), detail


def test_report_ends_with_the_summary_line_and_the_plot_is_written(outcome, tmp_path):
    from mpsim.calibrate.check.plot import plot_validation
    from mpsim.calibrate.check.report import format_validation

    report = format_validation(outcome)
    last = report.splitlines()[-1]
    assert re.fullmatch(r"median_abs_error_pct=\d+\.\d\d max_abs_error_pct=\d+\.\d\d schedules=\d+", last)
    assert f"schedules={sum(c.held_out for c in outcome.checks)}" in last
    assert "machine load" in report and "efficiency multiplier" in report
    # where each schedule's step differs, per rank: the three parts add up to the ends' difference
    assert "where the step differs, per rank" in report
    for check in outcome.checks:
        for rank, miss in enumerate(check.miss_by_rank()):
            measured_end = statistics.median(s.actions[rank][-1].end_s for s in check.steps)
            predicted_end = check.result.timeline.actions[rank][-1].end_s
            assert sum(miss) == pytest.approx(measured_end - predicted_end, abs=1e-9), (check.name, rank)
    plot_validation(outcome.checks, str(tmp_path / "timelines.png"))
    assert (tmp_path / "timelines.png").stat().st_size > 10_000
