"""Calibration profiles without torch: format, round trip, the cost-model hooks, fits, helpers.

The profiles here are synthetic: every op of the validation scenario "measured" at a
known multiple of what the datasheet model predicts, so the expected effect on the
simulation is known exactly.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from mpsim.calibrate.fit import fitting
from mpsim.calibrate.fit.build import compute_profile, links_profile, split_backward
from mpsim.calibrate.check.compare import fit_in_range
from mpsim.calibrate.fit.fitting import weight_slowdown
from mpsim.calibrate.measure.jobs import (MeasureSettings, measured_ops, validation_job,
                                  validation_plan)
from mpsim.calibrate.measure.machine import CpuSample, foreign_share, worker_environment
from mpsim.calibrate.runner import calibration_job
from mpsim.calibrate.check.measured import framework_gaps, order_mismatch, parse_steps
from mpsim.cli import main
from mpsim.cost.actions import CostModel
from mpsim.cost.calibrated import CalibratedCosts, calibrated_costs, gemm_layout
from mpsim.cost.collectives import p2p_time
from mpsim.cost.compute import ComputeModel
from mpsim.errors import InputError
from mpsim.schedules import build_schedule
from mpsim.simulate import simulate
from mpsim.specs import load_scenario, resolve_layout
from mpsim.specs.calibration import ActionFit, CalibrationProfile, DeviceInfo, SplitBackward, write_profile
from mpsim.workload.ops import Op
from tests.conftest import SCENARIOS

VALIDATION = SCENARIOS / "validation_2xcpu.yaml"


def synthetic_profile(factor: float, fit: ActionFit | None = None, p2p=(50e-6, 2e9)) -> CalibrationProfile:
    """Every op of the validation scenario at ``factor`` x its datasheet time; gloo-like links."""
    scenario = load_scenario(VALIDATION).scenario
    accelerator = scenario.cluster.system.accelerator
    datasheet = ComputeModel(accelerator, scenario.training.dtype)
    merged = []
    for record in measured_ops([scenario], scenario.training.dtype):
        op = Op(record["name"], record["kind"], flops=record["flops"], bytes=record["bytes"],
                shape=tuple(record["shape"]) if record["shape"] else None, direction=record["direction"])
        merged.append((record, {"seconds": factor * datasheet.time(op), "spread": 0.01, "samples": 9}))
    compute = compute_profile(merged, "fp32", accelerator.peak("fp32"), (0.3, 0.25))
    latency, bandwidth = p2p
    sizes = [4096.0, 65536.0, 2.0**20, 4 * 2.0**20]
    raw = {"p2p": [{"bytes": s, "seconds": latency + s / bandwidth, "spread": 0.02, "samples": 15} for s in sizes],
           "collectives": [{"kind": "all-reduce", "ranks": 2, "bytes": s, "seconds": 2 * latency + s / bandwidth,
                            "spread": 0.02, "samples": 15} for s in sizes]}
    device = DeviceInfo(kind="cpu", name="synthetic", cores=2, ranks=2, threads_per_rank=1, torch="none",
                        python="3", platform="test")
    return CalibrationProfile(description=f"datasheet x {factor}", device=device, compute=compute,
                              links=links_profile(raw, "gloo"), fit=fit)


def read_back(path) -> CalibrationProfile:
    """A profile file as a scenario that names it reads it (the loader's own path)."""
    return load_scenario(VALIDATION, [f"calibration={path}"]).scenario.calibration


def with_profile(profile, *overrides):
    scenario = load_scenario(VALIDATION, list(overrides)).scenario
    return scenario.model_copy(update={"calibration": profile})


def test_profile_round_trips_through_yaml_and_json_with_the_same_predictions(tmp_path):
    profile = synthetic_profile(1.3, ActionFit(fitted_on="1f1b", efficiency_multiplier=0.95, action_overhead_s=4e-4))
    before = simulate(with_profile(profile))
    for name in ("profile.yaml", "profile.json"):
        write_profile(profile, tmp_path / name)
        again = read_back(tmp_path / name)
        assert again == profile
        after = simulate(with_profile(again))
        assert after.timeline.pipeline_end_s == before.timeline.pipeline_end_s
        assert {k: c.duration_s for k, c in after.costs.items()} == {k: c.duration_s for k, c in before.costs.items()}


def test_scenario_names_a_profile_relative_to_its_own_file(tmp_path):
    profile = synthetic_profile(1.3)
    (tmp_path / "profiles").mkdir()
    write_profile(profile, tmp_path / "profiles" / "here.yaml")
    text = VALIDATION.read_text() + "calibration: profiles/here.yaml\n"
    (tmp_path / "job.yaml").write_text(text)
    loaded = load_scenario(tmp_path / "job.yaml")
    assert loaded.scenario.calibration == profile
    assert simulate(loaded.scenario).timeline.pipeline_end_s == simulate(with_profile(profile)).timeline.pipeline_end_s


def test_a_broken_profile_is_one_line_naming_its_file(tmp_path):
    write_profile(synthetic_profile(1.0), tmp_path / "p.yaml")
    data = yaml.safe_load((tmp_path / "p.yaml").read_text())
    data["compute"]["gemm_curve"]["max_efficiency"] = -1
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "job.yaml").write_text(VALIDATION.read_text() + "calibration: p.yaml\n")
    with pytest.raises(InputError) as info:
        load_scenario(tmp_path / "job.yaml")
    assert "p.yaml" in str(info.value) and "max_efficiency" in str(info.value)
    (tmp_path / "job.yaml").write_text(VALIDATION.read_text() + "calibration: missing.yaml\n")
    with pytest.raises(InputError, match="not found"):
        load_scenario(tmp_path / "job.yaml")


@pytest.mark.parametrize("factor", [0.5, 1.6])
def test_profile_moves_the_prediction_the_way_the_measurements_say(factor):
    datasheet = simulate(load_scenario(VALIDATION).scenario).timeline.pipeline_end_s
    calibrated = simulate(with_profile(synthetic_profile(factor))).timeline.pipeline_end_s
    # ops measured slower than the datasheet says make the step slower, faster ones faster,
    # and by about the factor (transfers and the measured points' curve fits aside)
    assert (calibrated > datasheet) == (factor > 1)
    assert 0.85 * factor < calibrated / datasheet < 1.15 * factor


def test_fit_multiplier_and_overhead_enter_every_action():
    plain = simulate(with_profile(synthetic_profile(1.0)))
    fit = ActionFit(fitted_on="1f1b", efficiency_multiplier=0.8, action_overhead_s=2e-3)
    fitted = simulate(with_profile(synthetic_profile(1.0, fit)))
    for key, cost in plain.costs.items():
        if len(key) == 2:  # one action: its ops slowed by 1/0.8, plus one overhead
            assert math.isclose(fitted.costs[key].duration_s, cost.duration_s / 0.8 + 2e-3, rel_tol=1e-9)


def test_split_backward_slows_every_weight_pass_but_the_first_stages(tmp_path):
    split = SplitBackward(full_s=0.02, input_s=0.011, weight_s=0.0108, weight_slowdown=1.2, samples=5)
    plain = synthetic_profile(1.0)
    measured = plain.model_copy(update={"compute": plain.compute.model_copy(update={"split_backward": split})})
    zbv = ("parallel.schedule=zbv", "parallel.vpp=2")
    before, after = simulate(with_profile(plain, *zbv)), simulate(with_profile(measured, *zbv))
    for (stage, kind), cost in before.costs.items():
        slowed = after.costs[(stage, kind)]
        if kind == "W" and stage > 0:
            assert math.isclose(slowed.compute_s, 1.2 * cost.compute_s, rel_tol=1e-9)
        else:  # the first stage's W is its whole backward: nothing split there
            assert slowed.compute_s == cost.compute_s
    assert after.timeline.pipeline_end_s > before.timeline.pipeline_end_s
    # schedules without a split backward never run a W
    onef1b = simulate(with_profile(plain)).timeline.pipeline_end_s
    assert simulate(with_profile(measured)).timeline.pipeline_end_s == onef1b
    write_profile(measured, tmp_path / "split.yaml")
    assert read_back(tmp_path / "split.yaml") == measured


def test_split_backward_merges_over_ranks_and_rejects_an_impossible_measurement():
    rank = {"full_s": 0.02, "input_s": 0.01, "weight_s": 0.011, "weight_slowdown": 1.1, "spread": 0.05, "samples": 4}
    merged = split_backward([{"split_backward": rank}, {"split_backward": {**rank, "weight_slowdown": 1.3,
                                                                            "spread": 0.1}}, {}])
    assert math.isclose(merged.weight_slowdown, 1.2) and merged.spread == 0.1 and merged.samples == 8
    assert split_backward([{}, {}]) is None
    assert math.isclose(weight_slowdown(0.02, 0.011, 0.0108), 1.2)
    with pytest.raises(ValueError, match="no longer than"):
        weight_slowdown(0.01, 0.012, 0.001)


def test_only_the_validation_model_measures_the_split_backward():
    plan = validation_plan(VALIDATION, ["1f1b", "zbv"], 2)
    job = validation_job(plan, "cpu", MeasureSettings())
    assert job["split"]["shape"]["layers"] == 8 and job["split"]["shape"]["hidden"] == 512
    # a calibration job prices a scenario at its per-rank shapes; one whole layer of a large model is not a
    # microbenchmark, so its split backward is the validation model's, measured with the fit schedule
    _, scenario, calibration = calibration_job("cpu", 2, str(SCENARIOS / "gpt3_175b_64xa100.yaml"), [],
                                               MeasureSettings())
    assert scenario.model.hidden_size == 12288
    assert calibration["split"]["shape"]["hidden"] == 512 and calibration["split"]["shape"]["layers"] == 8
    assert [entry["name"] for entry in calibration["pipeline"]["schedules"]] == ["1f1b"]
    assert "tp" not in calibration["phases"]


def test_links_come_from_the_profile():
    latency, bandwidth = 123e-6, 1.5e9
    scenario = with_profile(synthetic_profile(1.0, p2p=(latency, bandwidth)))
    model = CostModel(scenario, resolve_layout(scenario))
    assert math.isclose(p2p_time(1e6, True, model.system), latency + 1e6 / bandwidth, rel_tol=1e-6)
    costs = CalibratedCosts(scenario.calibration)
    assert math.isclose(costs.collective_s("all-reduce", 1e6, 2), 2 * latency + 1e6 / bandwidth, rel_tol=1e-6)
    # a group size not measured scales the ring's steps and volume: 4 ranks, 3x the latency steps
    assert math.isclose(costs.collective_s("all-reduce", 1e6, 4), 3 * 2 * latency + 1.5e6 / bandwidth, rel_tol=1e-6)
    assert costs.collective_s("all-reduce", 1e6, 1) == 0.0


def test_measured_points_are_used_exactly_and_the_curve_elsewhere():
    profile = synthetic_profile(2.0)
    costs = calibrated_costs(with_profile(profile))
    point = profile.compute.gemm_points[0]
    op = Op("mlp.fc1" if point.layout == "forward" else f"x.{point.layout}", "gemm", flops=point.flops, bytes=1.0,
            shape=point.shape)
    assert costs.op_seconds(op) == point.seconds
    odd = Op("other", "gemm", flops=3.3e8, bytes=1.0, shape=(1, 333, 777, 640))
    assert costs.op_seconds(odd) == pytest.approx(profile.compute.gemm_curve.seconds(3.3e8))


def test_gemm_layout_names():
    assert gemm_layout("mlp.fc1", 1) == "forward"
    assert gemm_layout("mlp.fc1.dgrad", 1) == "dgrad"
    assert gemm_layout("mlp.fc1.wgrad", 1) == "wgrad"
    assert gemm_layout("attn.scores", 8) == "batched"


def test_line_fits_recover_known_parameters():
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    latency, bandwidth, rms = fitting.alpha_beta(sizes, [30e-6 + s / 3e9 for s in sizes])
    assert latency == pytest.approx(30e-6, rel=1e-6) and bandwidth == pytest.approx(3e9, rel=1e-6) and rms < 1e-9
    flops = [1e6, 1e7, 1e8, 1e9]
    e_max, half, _ = fitting.gemm_curve(flops, [(f + 2e6) / (1e11 * 0.6) for f in flops], 1e11)
    assert e_max == pytest.approx(0.6, rel=1e-6) and half == pytest.approx(2e6, rel=1e-6)
    # a negative intercept would be unphysical: the fit goes through the origin instead
    line = fitting.fit_line([1, 2, 3], [0.5, 1.6, 2.7])
    assert line.intercept == 0.0 and line.slope > 0


def test_action_fit_recovers_the_multiplier():
    predicted = [0.020, 0.022, 0.041, 0.045, 0.060]
    result = fitting.fit_actions(predicted, [p / 0.9 for p in predicted])
    assert result.efficiency_multiplier == pytest.approx(0.9, rel=1e-9)
    assert result.rms_error_pct < 1e-6
    noisy = fitting.fit_actions(predicted, [p / 0.9 * (1.05 if i % 2 else 0.95) for i, p in enumerate(predicted)])
    assert noisy.efficiency_multiplier == pytest.approx(0.9, rel=0.05) and noisy.rms_error_pct > 3


def test_fit_range_check_flags_what_is_out_of_range():
    ok = ActionFit(fitted_on="1f1b", efficiency_multiplier=1.02, action_overhead_s=1e-3)
    assert fit_in_range(ok) == []
    slow = ActionFit(fitted_on="1f1b", efficiency_multiplier=0.5, action_overhead_s=1e-3)
    costly = ActionFit(fitted_on="1f1b", efficiency_multiplier=1.0, action_overhead_s=0.02)
    assert "multiplier" in fit_in_range(slow)[0]
    assert "overhead" in fit_in_range(costly)[0]


def _step(rank_actions, waits, start=10.0):
    return {"start_s": start, "end_s": start + 1, "actions": rank_actions, "waits": waits, "foreign_cpu_share": 0.0}


def test_measured_steps_merge_the_loss_and_separate_waits_from_gaps():
    rank0 = [[0, "F", 0, 10.00, 10.02], [0, "F", 1, 10.021, 10.04], [0, "B", 0, 10.10, 10.14]]
    rank1 = [[1, "F", 0, 10.03, 10.05], [1, "L", 0, 10.05, 10.051], [1, "B", 0, 10.052, 10.09]]
    steps = parse_steps([{"steps": [_step(rank0, [[10.041, 10.099]])]}, {"steps": [_step(rank1, [[10.0, 10.029]])]}])
    step = steps[0]
    forward = step.by_key[1][(1, "F", 0)]
    assert forward.end_s == pytest.approx(0.051)  # the loss counts into the last stage's forward
    assert (1, "L", 0) not in step.by_key[1]
    assert step.step_s == pytest.approx(0.14)
    gaps = framework_gaps(steps)
    # rank 0: 1 ms between its forwards, then 60 ms of which 58 ms blocked in a receive
    assert gaps[0] == pytest.approx(0.001) and gaps[1] == pytest.approx(0.002)
    schedule = build_schedule("gpipe", 2, 1, 1)
    assert order_mismatch(step, schedule) is not None  # rank 0 ran two forwards, gpipe with m=1 has one


def test_foreign_share_subtracts_our_own_cpu_time():
    before, after = CpuSample(100.0, 1000.0, 0.0), CpuSample(101.5, 1002.0, 1.0)
    # 2 s of CPU on 2 cores; 1.5 s busy, of which 1.0 s ours: a quarter of the machine was someone else
    assert foreign_share(before, after, 1.0) == pytest.approx(0.25)
    assert foreign_share(before, after, 2.0) == 0.0
    assert foreign_share(None, after, 0.0) is None


def test_worker_environment_pins_threads_and_the_allocator():
    env = worker_environment(1)
    assert env["OMP_NUM_THREADS"] == "1"
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"):
        assert int(env[name]) > 0


def test_validation_plan_places_stages_as_the_schedules_do():
    plan = validation_plan(VALIDATION, ["1f1b", "interleaved-1f1b", "zbv"], 2)
    assert plan.variants["zbv"].parallel.vpp == 2 and plan.variants["1f1b"].parallel.vpp == 1
    layout = resolve_layout(plan.variants["zbv"])
    schedule = build_schedule("zbv", layout.pp, layout.vpp, layout.num_microbatches)
    assert schedule.stage_to_rank == (0, 1, 1, 0)  # the V
    # the TP check at the model's own width first, then at narrower and wider ones
    assert [single.model.hidden_size for single, _ in plan.tp_pairs] == [512, 256, 768]
    for single, split in plan.tp_pairs:
        assert split.parallel.tp == 2 and single.parallel.tp == 1
        assert split.model.hidden_size == single.model.hidden_size
        assert single.model.ffn_hidden_size == 4 * single.model.hidden_size


def test_commands_without_torch_say_how_to_install_it(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    for command in (["validate"], ["calibrate", "--out", "x.yaml"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "pip install" in err[0] and "mpsim[calibrate]" in err[0]


def test_profile_json_is_plain_numbers(tmp_path):
    write_profile(synthetic_profile(1.0), tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["format"] == "mpsim-calibration/1"
    assert data["links"]["p2p"]["bandwidth"] == pytest.approx(2e9, rel=1e-6)


def test_a_collective_whose_time_does_not_grow_with_size_is_a_flat_line():
    # timed after compute, a small gloo collective's time is mostly its wait for the peer: four
    # sizes whose medians fall with size (seen on a 2-core machine) fit no positive bandwidth
    sizes = [65536.0, 262144.0, 2.0**20, 4 * 2.0**20]
    seconds = [2.6e-3, 2.5e-3, 2.4e-3, 2.45e-3]
    raw = {"p2p": [{"bytes": s, "seconds": 50e-6 + s / 2e9, "spread": 0.02, "samples": 15} for s in sizes],
           "collectives": [{"kind": "all-reduce", "ranks": 2, "bytes": s, "seconds": t, "spread": 0.3, "samples": 15}
                           for s, t in zip(sizes, seconds)]}
    (fit,) = links_profile(raw, "gloo").collectives
    assert fit.bandwidth is None and fit.latency_s == pytest.approx(2.475e-3)
    assert fit.seconds(1e9) == fit.seconds(1.0) == pytest.approx(2.475e-3)
    assert 0 < fit.rms_error < 0.05


def test_the_report_prints_a_flat_collective_line():
    from mpsim.calibrate.check.report import profile_lines

    sizes = [65536.0, 2.0**20]
    raw = {"p2p": [{"bytes": s, "seconds": 50e-6 + s / 2e9, "spread": 0.02, "samples": 15} for s in sizes],
           "collectives": [{"kind": "all-gather", "ranks": 2, "bytes": s, "seconds": t, "spread": 0.3, "samples": 15}
                           for s, t in zip(sizes, (2.0e-3, 1.9e-3))]}
    profile = synthetic_profile(1.0).model_copy(update={"links": links_profile(raw, "gloo")})
    text = "\n".join(profile_lines(profile))
    assert "all-gather" in text and "whatever the size" in text
