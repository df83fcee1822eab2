"""The documented workflow: ``calibrate``, then ``run`` with the profile, predicts what ``validate`` predicts.

No measurement runs here. The workers' results of a calibration job are made up
from mpsim's own datasheet times (ops at 1.3x, gloo-like links, a split backward)
and a 1F1B training step whose actions run 10-20 % longer than the microbenchmarks
add up to, as a real job's do. From those results the calibrate path fits and writes
its profile; the run path reads the file back as a scenario that names it and
simulates; the validate path analyses the same results and simulates each schedule
with its profile. All three must agree to 1e-9, and the fit must matter (without it
the prediction is off by the in-job slowdown), so that dropping the fit from the
written profile, the bug this guards against, fails here.
"""

from __future__ import annotations

import math

import pytest

from mpsim.calibrate.check.compare import with_profile
from mpsim.calibrate.fit.build import build_profile
from mpsim.calibrate.measure.jobs import FIT_SCHEDULE, MeasureSettings
from mpsim.calibrate.measure.machine import worker_environment
from mpsim.calibrate.runner import analyse, calibration_from_results, calibration_job
from mpsim.cost.compute import ComputeModel
from mpsim.errors import InputError
from mpsim.schedules.actions import parts
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.calibration import write_profile
from mpsim.workload.ops import Op
from tests.conftest import SCENARIOS

VALIDATION = SCENARIOS / "validation_2xcpu.yaml"
WORLD = 2
OP_FACTOR = 1.3  # every op measured at this multiple of its datasheet time
IN_JOB_SLOWDOWN = (1.1, 1.2)  # actions of the training job run this much longer, alternately
GAP_S = 4e-4  # framework time between two actions of a rank


def _worker_results(job: dict, scenario) -> list[dict]:
    """What the two workers of ``job`` would report, without the training steps."""
    datasheet = ComputeModel(scenario.cluster.system.accelerator, scenario.training.dtype)
    ops = []
    for record in job["ops"]:
        op = Op(record["name"], record["kind"], flops=record["flops"], bytes=record["bytes"],
                shape=tuple(record["shape"]) if record["shape"] else None, direction=record["direction"])
        ops.append({"seconds": OP_FACTOR * datasheet.time(op), "spread": 0.02, "samples": 9,
                    "foreign_cpu_share": 0.01, "slowdown": 1.02})
    sizes = [4096.0, 65536.0, 2.0**20, 4 * 2.0**20]
    links = {"p2p": [{"bytes": s, "seconds": 60e-6 + s / 1.5e9, "spread": 0.02, "samples": 15} for s in sizes],
             "collectives": [{"kind": "all-reduce", "ranks": WORLD, "bytes": s, "seconds": 120e-6 + s / 1.5e9,
                              "spread": 0.02, "samples": 15} for s in sizes],
             "foreign_cpu_share": 0.0, "slowdown": 1.0}
    split = {"full_s": 0.02, "input_s": 0.011, "weight_s": 0.0108, "weight_slowdown": 1.2, "spread": 0.01,
             "samples": 3, "foreign_cpu_share": 0.0, "slowdown": 1.0}
    return [{"rank": rank, "ops": ops, "split_backward": split, "device_name": "Test CPU", "torch": "2.13.0",
             "python": "3.12", "platform": "test", **({"links": links} if rank == 0 else {})}
            for rank in range(WORLD)]


def _training_steps(plan, job: dict, results: list[dict], steps: int, in_job_slowdown=IN_JOB_SLOWDOWN) -> None:
    """Add measured 1F1B steps to ``results``: the simulated actions, each run longer, one after another."""
    profile = build_profile(job["ops"], results, device="cpu", world=WORLD, threads=1, dtype="fp32",
                            accelerator=plan.base.cluster.system.accelerator, environment=worker_environment(1))
    timeline = simulate(with_profile(plan.variants[FIT_SCHEDULE], profile)).timeline
    for result in results:
        result["pipeline"] = {FIT_SCHEDULE: {"steps": [], "attempts": []}}
    for step in range(steps):
        for rank, records in enumerate(timeline.actions):
            clock, actions, waits = 0.0, [], []
            for index, record in enumerate(records):
                slow = in_job_slowdown[(index + step) % 2]
                start = max(clock, record.start_s * max(in_job_slowdown))  # keeps the pipeline's order
                if start > clock:  # the rank waits for its input, blocked in a receive
                    waits.append([clock, start])
                for action in parts(record.action):
                    end = start + slow * (record.end_s - record.start_s) / len(parts(record.action))
                    actions.append([action.stage, action.kind, action.microbatch, start, end])
                    start = end
                clock = start + GAP_S
            report = results[rank]["pipeline"][FIT_SCHEDULE]
            report["steps"].append({"start_s": 0.0, "actions": actions, "waits": waits, "foreign_cpu_share": 0.01,
                                    "slowdown": 1.0, "disturbed": False})
            report["attempts"].append({"foreign_cpu_share": 0.01, "slowdown": 1.0})


def _measure(in_job_slowdown=IN_JOB_SLOWDOWN):
    settings = MeasureSettings(steps=3)
    plan, scenario, job = calibration_job("cpu", WORLD, None, [], settings)
    results = _worker_results(job, scenario)
    _training_steps(plan, job, results, settings.steps, in_job_slowdown)
    return plan, scenario, job, results, settings


@pytest.fixture(scope="module")
def measured():
    return _measure()


@pytest.fixture(scope="module")
def calibrated(measured, tmp_path_factory):
    """The calibrate path: fit, and the profile file it writes."""
    plan, scenario, job, results, settings = measured
    outcome = calibration_from_results(plan, job, results, "cpu", WORLD, settings, scenario)
    path = tmp_path_factory.mktemp("workflow") / "here.yaml"
    write_profile(outcome.profile, path)
    return outcome, path


def _run_path(profile_file, *overrides) -> float:
    """``mpsim run scenarios/validation_2xcpu.yaml --set calibration=FILE``: how the run command loads and simulates."""
    loaded = load_scenario(VALIDATION, [*overrides, f"calibration={profile_file}"])
    return simulate(loaded.scenario, loaded.path.parent).timeline.pipeline_end_s


def test_the_calibrate_profile_carries_the_fit(calibrated):
    outcome, _ = calibrated
    fit = outcome.profile.fit
    assert fit is not None and fit.fitted_on == FIT_SCHEDULE
    # the in-job actions ran 10-20 % longer than their ops: the multiplier says so, and is in range
    assert 1 / max(IN_JOB_SLOWDOWN) - 0.02 < fit.efficiency_multiplier < 1 / min(IN_JOB_SLOWDOWN) + 0.02
    assert math.isclose(fit.action_overhead_s, GAP_S, rel_tol=1e-6)
    assert outcome.fit_problems == []


def test_calibrate_then_run_predicts_what_validate_predicts(measured, calibrated):
    plan, _, job, results, settings = measured
    outcome, path = calibrated
    validation = analyse(plan, job, results, "cpu", WORLD, settings)
    assert validation.fit == outcome.fit  # one fit, made the same way on the same measurements
    check = next(c for c in validation.checks if c.name == FIT_SCHEDULE)
    predicted_by_run = _run_path(path)
    assert math.isclose(predicted_by_run, check.predicted_step_s, rel_tol=1e-9)
    # the fit is what makes them agree: without it the run would predict the microbenchmarks' sum
    without_fit = simulate(with_profile(plan.variants[FIT_SCHEDULE],
                                        outcome.profile.model_copy(update={"fit": None}))).timeline.pipeline_end_s
    assert predicted_by_run > 1.05 * without_fit


@pytest.mark.parametrize("schedule, vpp", [("gpipe", 1), ("interleaved-1f1b", 2), ("zbv", 2)])
def test_other_schedules_are_predicted_as_validate_predicts_them(calibrated, schedule, vpp):
    outcome, path = calibrated
    variant = load_scenario(VALIDATION, [f"parallel.schedule={schedule}", f"parallel.vpp={vpp}"]).scenario
    validate_prediction = simulate(with_profile(variant, outcome.profile)).timeline.pipeline_end_s
    run_prediction = _run_path(path, f"parallel.schedule={schedule}", f"parallel.vpp={vpp}")
    assert math.isclose(run_prediction, validate_prediction, rel_tol=1e-9)


def test_calibrating_another_scenario_measures_its_ops_and_still_fits_on_the_validation_job():
    plan, scenario, job = calibration_job("cpu", WORLD, str(SCENARIOS / "megatron_22b_8xa100.yaml"), [],
                                          MeasureSettings())
    assert scenario.name != plan.base.name
    assert [entry["name"] for entry in job["pipeline"]["schedules"]] == [FIT_SCHEDULE]
    widths = {tuple(r["shape"]) for r in job["ops"] if r["kind"] == "gemm"}
    hidden = scenario.model.hidden_size
    assert any(hidden in shape for shape in widths)  # the scenario's own GEMMs
    assert any(512 in shape for shape in widths)  # and the validation model's, for the fit


# ---- the commands around it: a fit out of range fails, --allow-busy does not wait, progress is shown

SLOW_JOB = (1.6, 1.7)  # a job whose actions run 60-70 % over their ops: multiplier about 0.6, out of range


def test_an_out_of_range_fit_fails_calibrate_with_a_line_naming_it(monkeypatch, tmp_path, capsys):
    from mpsim.calibrate import runner
    from mpsim.cli import main

    plan, scenario, job, results, settings = _measure(SLOW_JOB)
    outcome = calibration_from_results(plan, job, results, "cpu", WORLD, settings, scenario)
    assert outcome.fit.efficiency_multiplier < 0.75 and outcome.fit_problems
    monkeypatch.setattr(runner, "calibrate", lambda *args, **kwargs: outcome)
    code = main(["calibrate", "--device", "cpu", "--out", str(tmp_path / "p.yaml")])
    captured = capsys.readouterr()
    assert code == 1
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "efficiency multiplier" in errors[0] and "outside [0.75, 1.25]" in errors[0]
    assert "OUT OF RANGE" in captured.out
    assert (tmp_path / "p.yaml").is_file()  # written for a look, and said to be unfit


def test_an_out_of_range_fit_fails_validate_with_a_line_naming_it(monkeypatch, capsys):
    from mpsim.calibrate import runner
    from mpsim.cli import main

    plan, _, job, results, settings = _measure(SLOW_JOB)
    outcome = analyse(plan, job, results, "cpu", WORLD, settings)
    monkeypatch.setattr(runner, "validate", lambda *args, **kwargs: outcome)
    code = main(["validate", "--device", "cpu", "--schedules", "1f1b"])
    captured = capsys.readouterr()
    assert code == 1
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "efficiency multiplier" in errors[0] and "outside [0.75, 1.25]" in errors[0]


def test_an_in_range_fit_succeeds(monkeypatch, calibrated, tmp_path, capsys):
    from mpsim.calibrate import runner
    from mpsim.cli import main

    outcome, _ = calibrated
    monkeypatch.setattr(runner, "calibrate", lambda *args, **kwargs: outcome)
    assert main(["calibrate", "--device", "cpu", "--out", str(tmp_path / "p.yaml")]) == 0
    assert "error" not in capsys.readouterr().err


def test_allow_busy_starts_at_once_and_waits_otherwise(monkeypatch):
    from mpsim.calibrate import runner

    waited = []
    monkeypatch.setattr(runner, "wait_until_quiet", lambda limit, wait_s, say=None: waited.append(wait_s) or 0.6)
    monkeypatch.setattr(runner, "machine_busy_share", lambda window_s: 0.6)
    said: list[str] = []
    assert runner.check_machine(MeasureSettings(), 60.0, True, said.append) == 0.6
    assert waited == [] and "at once" in said[0]
    with pytest.raises(InputError, match="--allow-busy"):
        runner.check_machine(MeasureSettings(), 60.0, False, said.append)
    assert waited == [60.0]


def test_progress_lines_reach_the_waiting_process_whole(tmp_path):
    from mpsim.calibrate.measure.progress import PROGRESS_FILE, ProgressReader, ProgressWriter

    reader = ProgressReader(tmp_path)
    assert reader.new_lines() == []  # no file yet
    ProgressWriter(tmp_path, 0)("ops: pass 1 of 5 over 209 ops ...")
    ProgressWriter(tmp_path, 1)("rank 1 says nothing")
    with open(tmp_path / PROGRESS_FILE, "a") as out:
        out.write("pipeline: step 1 of")  # a line still being written
    assert reader.new_lines() == ["ops: pass 1 of 5 over 209 ops ..."]
    with open(tmp_path / PROGRESS_FILE, "a") as out:
        out.write(" 5 ...\n")
    assert reader.new_lines() == ["pipeline: step 1 of 5 ..."]
    assert reader.new_lines() == []
