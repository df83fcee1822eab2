"""``calibrate`` and ``validate`` from end to end: plan, check the machine, measure, fit, compare.

Both run the same measurement and the same fit, so a profile from either predicts
the same: ``calibrate`` measures the ops a scenario needs (the validation scenario's
when none is given), the links, and the fit schedule (1F1B) of the validation job,
fits the in-job multiplier and overhead on it (:func:`fitted_profile`) and writes
the profile; ``validate`` runs the validation job under several schedules, makes the
same fit on 1F1B and checks the profile on the others and on the TP check. Neither
imports torch in this process (the workers do), except to count GPUs for
``--device cuda``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mpsim.calibrate import require_torch
from mpsim.calibrate.fit.build import build_profile
from mpsim.calibrate.check.compare import ScheduleCheck, check_schedule, fit_in_range, fit_profile
from mpsim.calibrate.measure.jobs import (FIT_SCHEDULE, VALIDATION_SCENARIO, MeasureSettings, ValidationPlan,
                                         validation_job, validation_plan)
from mpsim.calibrate.measure.launch import run_job, wait_until_quiet
from mpsim.calibrate.measure.machine import cpu_count, machine_busy_share, worker_environment
from mpsim.calibrate.check.measured import parse_steps
from mpsim.specs.calibration import ActionFit, CalibrationProfile
from mpsim.calibrate.check.tp_predict import TpCheck, tp_checks
from mpsim.errors import InputError
from mpsim.specs import load_scenario
from mpsim.specs.scenario import Scenario
from mpsim.specs.loader import find_reference

DEFAULT_SYSTEM = {"cpu": "local-cpu", "cuda": "hgx-h200"}
DEFAULT_DTYPE = {"cpu": "fp32", "cuda": "bf16"}


def device_ranks(device: str, ranks: int | None) -> int:
    """Processes to run: one per core (at most 2 by default) on CPU, one per GPU on CUDA."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError("no CUDA device is visible; use --device cpu", "--device")
        return min(ranks or count, count)
    cores = cpu_count()
    wanted = ranks or min(2, cores)
    if wanted > cores:
        raise InputError(f"{wanted} ranks of one thread need {wanted} cores; this machine lets us use {cores}",
                         "--ranks")
    return wanted


def device_overrides(device: str, system: str | None) -> list[str]:
    """The scenario's system and dtype for the device measured (and, on GPUs, a name that says so:
    the shipped validation scenario is named for its CPU ranks)."""
    overrides = [f"cluster.system={system or DEFAULT_SYSTEM[device]}", f"training.dtype={DEFAULT_DTYPE[device]}"]
    if device == "cuda":
        overrides.append("name=validation on CUDA devices")
    return overrides


def check_machine(settings: MeasureSettings, wait_s: float, allow_busy: bool, say) -> float | None:
    """Wait for a quiet machine; refuse to measure a busy one unless told to.

    With ``allow_busy`` nothing waits: the machine is sampled once (a second), for the
    report, and measuring starts whatever it shows.
    """
    if allow_busy:
        share = machine_busy_share(1.0)
        if share is not None and share > settings.foreign_limit:
            say(f"machine busy ({100 * share:.0f} % of the CPU used by other processes): measuring at once "
                f"(--allow-busy, --wait skipped); the numbers are flagged")
        return share
    share = wait_until_quiet(settings.foreign_limit, wait_s, say=say)
    if share is not None and share > settings.foreign_limit:
        raise InputError(f"machine busy: other processes use {100 * share:.0f} % of the CPU (limit "
                         f"{100 * settings.foreign_limit:.0f} %), which would slow the measured ranks by about "
                         f"as much; rerun when it is quiet, or pass --allow-busy to measure anyway (runs are "
                         f"flagged)")
    return share


def fit_plan(device: str, world: int, system: str | None = None, overrides: list[str] | None = None,
             scenario_ref: str | None = None, schedules: list[str] | None = None) -> ValidationPlan:
    """The validation job's plan: its scenario (the shipped one unless named) under ``schedules``, 1F1B always."""
    path = Path(scenario_ref) if scenario_ref else find_reference(VALIDATION_SCENARIO, "scenario", None)
    if not path.is_file():
        path = find_reference(str(scenario_ref), "scenario", None)
    extra = [*(device_overrides(device, system) if not scenario_ref or system else []), *(overrides or [])]
    schedules = list(schedules or [])
    if FIT_SCHEDULE not in schedules:
        schedules = [FIT_SCHEDULE, *schedules]
    plan = validation_plan(path, schedules, world, extra)
    if FIT_SCHEDULE not in plan.variants:
        raise InputError(f"the fit schedule {FIT_SCHEDULE} cannot run here: {plan.unavailable.get(FIT_SCHEDULE)}")
    return plan


@dataclass
class CalibrationOutcome:
    """What ``mpsim calibrate`` measured and fitted."""

    profile: CalibrationProfile  # with the fit
    fit: ActionFit
    fit_problems: list[str]


def calibrate(device: str, scenario_ref: str | None, overrides: list[str], settings: MeasureSettings,
              ranks: int | None = None, wait_s: float = 60.0, allow_busy: bool = False, timeout_s: float = 1800.0,
              say=print) -> CalibrationOutcome:
    """Measure a scenario's ops and links on ``device`` and fit the profile on the validation job's 1F1B.

    The job is the validation job with one schedule and without the TP check, plus the
    ops of ``scenario_ref`` (the validation scenario when None). The fit is made as
    ``validate`` makes it (:func:`fitted_profile`), so the written profile predicts a
    scenario exactly as ``validate``'s would from the same measurements.
    """
    require_torch()
    if allow_busy:
        settings = replace(settings, keep_disturbed=True)
    world = device_ranks(device, ranks)
    plan, scenario, job = calibration_job(device, world, scenario_ref, overrides, settings)
    check_machine(settings, wait_s, allow_busy, say)
    say(f"measuring {len(job['ops'])} ops, the links and {settings.steps} steps of {FIT_SCHEDULE} (the fit) on "
        f"{world} rank(s) of {device} ...")
    results = run_job(job, world, 1, timeout_s, progress=say)
    return calibration_from_results(plan, job, results, device, world, settings, scenario)


def calibration_job(device: str, world: int, scenario_ref: str | None, overrides: list[str],
                    settings: MeasureSettings) -> tuple[ValidationPlan, Scenario, dict]:
    """The plan of the fit (the validation job's 1F1B, no TP check), the scenario calibrated for, and the job.

    ``overrides`` apply to ``scenario_ref``, or to the validation scenario when none is
    named. The split backward is measured on the validation model's layer, whatever the
    scenario: one layer of a large model is no microbenchmark.
    """
    if scenario_ref:
        scenario = load_scenario(scenario_ref, overrides).scenario
        plan = fit_plan(device, world)
    else:
        plan = fit_plan(device, world, overrides=overrides)
        scenario = plan.base
    plan.tp_pairs = []  # the TP check is validate's
    return plan, scenario, validation_job(plan, device, settings, also_measure=(scenario,))


def calibration_from_results(plan: ValidationPlan, job: dict, results: list[dict], device: str, world: int,
                             settings: MeasureSettings, scenario: Scenario) -> CalibrationOutcome:
    """The fitted profile of a calibration job's results (``scenario``: the one whose ops it measured)."""
    same = scenario.name == plan.base.name
    description = (f"ops of {scenario.name}" + ("" if same else f" and of {plan.base.name}")
                   + f"; fit on {FIT_SCHEDULE} of {plan.base.name} in the same job")
    fitted, fit, _ = fitted_profile(plan, job, results, device, world, settings, description,
                                    scenario.cluster.system.accelerator)
    return CalibrationOutcome(fitted, fit, fit_in_range(fit))


@dataclass
class ValidationOutcome:
    """Everything ``mpsim validate`` reports."""

    plan: ValidationPlan
    profile: CalibrationProfile  # with the fit
    fit: ActionFit
    fit_problems: list[str]
    checks: list[ScheduleCheck]
    tp: TpCheck | None  # the TP check at the model's own width
    skipped: dict[str, str] = field(default_factory=dict)
    quiet_share_before: float | None = None
    tp_widths: list[TpCheck] = field(default_factory=list)  # every width the TP check ran, the model's own first


def validate(device: str, schedules: list[str], settings: MeasureSettings, scenario_ref: str | None = None,
             overrides: list[str] | None = None, system: str | None = None, ranks: int | None = None,
             wait_s: float = 60.0, allow_busy: bool = False, timeout_s: float = 1800.0,
             say=print) -> ValidationOutcome:
    """Run the validation job and compare mpsim's predictions with it.

    ``allow_busy`` starts at once on a busy machine (no wait), keeps a training step
    none of whose tries was quiet (its least disturbed try, marked) instead of dropping
    it, so every schedule that runs yields steps, and stops trying disturbed
    measurements again once the job's wait budget is spent; the profile's conditions
    and the report say how disturbed the kept numbers were.
    """
    require_torch()
    if allow_busy:
        settings = replace(settings, keep_disturbed=True)
    world = device_ranks(device, ranks)
    plan = fit_plan(device, world, system, overrides, scenario_ref, schedules)
    job = validation_job(plan, device, settings)
    share = check_machine(settings, wait_s, allow_busy, say)
    say(f"measuring {len(job['ops'])} ops, the links, {len(plan.schedules)} schedules x {settings.steps} steps"
        f"{f' and the TP check at {len(plan.tp_pairs)} widths' if 'tp' in job else ''} on {world} rank(s) of "
        f"{device} ...")
    results = run_job(job, world, 1, timeout_s, progress=say)
    return analyse(plan, job, results, device, world, settings, share)


def fitted_profile(plan: ValidationPlan, job: dict, results: list[dict], device: str, world: int,
                   settings: MeasureSettings, description: str, accelerator=None
                   ) -> tuple[CalibrationProfile, ActionFit, dict]:
    """The profile of a job's measurements with the fit on its 1F1B steps, the fit, and what was measured.

    The one place a fit is made, for ``calibrate`` and ``validate`` alike. Returns the
    fitted profile, the fit and ``{"measured": {schedule: (steps, attempts)}, "skipped":
    {schedule: why}}``. ``accelerator`` gives the peak the GEMM curve is relative to
    (the plan's scenario's by default).
    """
    profile = build_profile(job["ops"], results, device=device, world=world, threads=1,
                            dtype=plan.base.training.dtype,
                            accelerator=accelerator or plan.base.cluster.system.accelerator,
                            environment=worker_environment(1), description=description)
    skipped = dict(plan.unavailable)
    measured: dict[str, tuple[list, int]] = {}
    for name in plan.schedules:
        reports = [r["pipeline"][name] for r in results]
        if "skipped" in reports[0]:
            skipped[name] = reports[0]["skipped"]
            continue
        steps = parse_steps(reports)
        attempts = reports[0]["attempts"]
        if not steps:
            skipped[name] = (f"no step was quiet enough in {len(attempts)} tries: other processes took "
                             f"{100 * min(a['foreign_cpu_share'] for a in attempts):.0f} % of the CPU or more, or "
                             f"the machine ran {min(a['slowdown'] for a in attempts):.2f}x slower than its best")
            continue
        measured[name] = (steps, len(attempts))
    if FIT_SCHEDULE not in measured:
        raise InputError(f"{FIT_SCHEDULE}, the fit schedule, has no usable step: {skipped.get(FIT_SCHEDULE)}")
    fit, _ = fit_profile(profile, plan.variants[FIT_SCHEDULE], measured[FIT_SCHEDULE][0], FIT_SCHEDULE)
    kept = [s for steps, _ in measured.values() for s in steps]
    worst = max([profile.conditions.foreign_cpu_share or 0.0, *(s.foreign_cpu_share for s in kept)])
    slowest = max([profile.conditions.canary_slowdown or 1.0, *(s.slowdown for s in kept)])
    conditions = profile.conditions.model_copy(update={"foreign_cpu_share": worst, "canary_slowdown": slowest,
                                                       "busy": worst > settings.foreign_limit})
    fitted = profile.model_copy(update={"fit": fit, "conditions": conditions})
    return fitted, fit, {"measured": measured, "skipped": skipped}


def analyse(plan: ValidationPlan, job: dict, results: list[dict], device: str, world: int,
            settings: MeasureSettings, quiet_share: float | None = None) -> ValidationOutcome:
    """Profile, fit and checks from the workers' results of a validation job."""
    fitted, fit, found = fitted_profile(plan, job, results, device, world, settings,
                                        f"ops of {plan.base.name}; fit on {FIT_SCHEDULE} of the same job")
    checks = [check_schedule(name, plan.variants[name], fitted, steps, attempts, held_out=name != FIT_SCHEDULE)
              for name, (steps, attempts) in found["measured"].items()]
    widths = tp_checks(results[0]["tp"], plan.tp_pairs, fitted) if plan.tp_pairs and "tp" in results[0] else []
    return ValidationOutcome(plan, fitted, fit, fit_in_range(fit), checks, widths[0] if widths else None,
                             found["skipped"], quiet_share, widths)
