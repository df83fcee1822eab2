"""``calibrate`` and ``validate`` from end to end: plan, check the machine, measure, fit, compare.

Both start from a scenario: ``calibrate`` measures the ops that scenario needs (the
validation scenario when none is given) and writes a profile; ``validate`` runs the
validation scenario for real under several schedules in the same job, fits the profile
on one schedule and checks it on the others. Neither imports torch in this process
(the workers do), except to count GPUs for ``--device cuda``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mpsim.calibrate import require_torch
from mpsim.calibrate.fit.build import build_profile
from mpsim.calibrate.check.compare import ScheduleCheck, check_schedule, fit_in_range, fit_profile
from mpsim.calibrate.measure.jobs import (FIT_SCHEDULE, MeasureSettings, ValidationPlan, calibration_job, validation_job,
                                  validation_plan)
from mpsim.calibrate.measure.launch import run_job, wait_until_quiet
from mpsim.calibrate.measure.machine import cpu_count, worker_environment
from mpsim.calibrate.check.measured import parse_steps
from mpsim.specs.calibration import ActionFit, CalibrationProfile
from mpsim.calibrate.check.tp_predict import TpCheck, tp_check
from mpsim.errors import InputError
from mpsim.specs import load_scenario
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
    """The scenario's system and dtype for the device measured."""
    return [f"cluster.system={system or DEFAULT_SYSTEM[device]}", f"training.dtype={DEFAULT_DTYPE[device]}"]


def check_machine(settings: MeasureSettings, wait_s: float, allow_busy: bool, say) -> float | None:
    """Wait for a quiet machine; refuse to measure a busy one unless told to."""
    share = wait_until_quiet(settings.foreign_limit, wait_s, say=say)
    if share is not None and share > settings.foreign_limit:
        if not allow_busy:
            raise InputError(f"machine busy: other processes use {100 * share:.0f} % of the CPU (limit "
                             f"{100 * settings.foreign_limit:.0f} %), which would slow the measured ranks by about "
                             f"as much; rerun when it is quiet, or pass --allow-busy to measure anyway (runs are "
                             f"flagged)")
        say(f"machine still busy ({100 * share:.0f} % of the CPU used by other processes): measuring anyway "
            f"(--allow-busy); the numbers are flagged")
    return share


def calibrate(device: str, scenario_ref: str | None, overrides: list[str], settings: MeasureSettings,
              ranks: int | None = None, wait_s: float = 60.0, allow_busy: bool = False, timeout_s: float = 1800.0,
              say=print) -> CalibrationProfile:
    """Measure the ops and links of a scenario on ``device``; the profile (not yet written)."""
    require_torch()
    if allow_busy:
        settings = replace(settings, keep_disturbed=True)
    world = device_ranks(device, ranks)
    ref = scenario_ref or str(find_reference("validation-2xcpu", "scenario", None))
    base_overrides = [] if scenario_ref else device_overrides(device, None)
    scenario = load_scenario(ref, [*base_overrides, *overrides]).scenario
    job = calibration_job(scenario, device, settings)
    check_machine(settings, wait_s, allow_busy, say)
    say(f"measuring {len(job['ops'])} ops and the links on {world} rank(s) of {device} ...")
    results = run_job(job, world, 1, timeout_s)
    return build_profile(job["ops"], results, device=device, world=world, threads=1, dtype=scenario.training.dtype,
                         accelerator=scenario.cluster.system.accelerator, environment=worker_environment(1),
                         description=f"ops of {scenario.name}")


@dataclass
class ValidationOutcome:
    """Everything ``mpsim validate`` reports."""

    plan: ValidationPlan
    profile: CalibrationProfile  # with the fit
    fit: ActionFit
    fit_problems: list[str]
    checks: list[ScheduleCheck]
    tp: TpCheck | None
    skipped: dict[str, str] = field(default_factory=dict)
    quiet_share_before: float | None = None


def validate(device: str, schedules: list[str], settings: MeasureSettings, scenario_ref: str | None = None,
             overrides: list[str] | None = None, system: str | None = None, ranks: int | None = None,
             wait_s: float = 60.0, allow_busy: bool = False, timeout_s: float = 1800.0,
             say=print) -> ValidationOutcome:
    """Run the validation job and compare mpsim's predictions with it.

    ``allow_busy`` measures a machine that stayed busy through ``wait_s``, keeps a
    training step none of whose tries was quiet (its least disturbed try, marked) instead
    of dropping it, so every schedule that runs yields steps, and stops trying disturbed
    measurements again once the job's wait budget is spent; the profile's conditions
    and the report say how disturbed the kept numbers were.
    """
    require_torch()
    if allow_busy:
        settings = replace(settings, keep_disturbed=True)
    world = device_ranks(device, ranks)
    path = Path(scenario_ref) if scenario_ref else find_reference("validation-2xcpu", "scenario", None)
    if not path.is_file():
        path = find_reference(str(scenario_ref), "scenario", None)
    extra = [*(device_overrides(device, system) if not scenario_ref or system else []), *(overrides or [])]
    if FIT_SCHEDULE not in schedules:
        schedules = [FIT_SCHEDULE, *schedules]
    plan = validation_plan(path, schedules, world, extra)
    if FIT_SCHEDULE not in plan.variants:
        raise InputError(f"the fit schedule {FIT_SCHEDULE} cannot run here: {plan.unavailable.get(FIT_SCHEDULE)}")
    job = validation_job(plan, device, settings)
    share = check_machine(settings, wait_s, allow_busy, say)
    say(f"measuring {len(job['ops'])} ops, the links, {len(plan.schedules)} schedules x {settings.steps} steps"
        f"{' and the TP check' if 'tp' in job else ''} on {world} rank(s) of {device} ...")
    results = run_job(job, world, 1, timeout_s)
    return analyse(plan, job, results, device, world, settings, share)


def analyse(plan: ValidationPlan, job: dict, results: list[dict], device: str, world: int,
            settings: MeasureSettings, quiet_share: float | None = None) -> ValidationOutcome:
    """Profile, fit and checks from the workers' results of a validation job."""
    profile = build_profile(job["ops"], results, device=device, world=world, threads=1,
                            dtype=plan.base.training.dtype, accelerator=plan.base.cluster.system.accelerator,
                            environment=worker_environment(1), description=f"ops of {plan.base.name}; fit on "
                                                                             f"{FIT_SCHEDULE} of the same job")
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
    checks = [check_schedule(name, plan.variants[name], fitted, steps, attempts, held_out=name != FIT_SCHEDULE)
              for name, (steps, attempts) in measured.items()]
    tp = None
    if plan.tp_split is not None and plan.tp_single is not None and "tp" in results[0]:
        tp = tp_check(results[0]["tp"], plan.tp_single, plan.tp_split, fitted)
    return ValidationOutcome(plan, fitted, fit, fit_in_range(fit), checks, tp, skipped, quiet_share)
