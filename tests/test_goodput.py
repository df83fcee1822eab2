"""Failures, checkpoints and the expected time to train: closed forms, a brute-force check of the
renewal process, monotonicity in the failure rate, and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mpsim.cli import main
from mpsim.errors import InputError
from mpsim.results import summarize
from mpsim.reliability.failures import PUBLISHED_RATES_PER_HOUR, job_failures
from mpsim.reliability.goodput import checkpoint_bytes, daly_interval_s, expected_run, goodput, young_interval_s
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

SCENARIO = str(SCENARIOS / "llama3_70b_32xh100.yaml")
RELIABLE = ["reliability.storage_bandwidth=100 GB/s", "reliability.restart_time=15 min"]


def test_young_and_daly_intervals_equal_their_closed_forms():
    delta, mtbf = 300.0, 3 * 3600.0
    assert young_interval_s(delta, mtbf) == pytest.approx(math.sqrt(2 * 300 * 10800))  # 2545.58 s
    ratio = 300 / (2 * 10800)
    daly = math.sqrt(2 * 300 * 10800) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - 300
    assert daly_interval_s(delta, mtbf) == pytest.approx(daly)
    assert daly_interval_s(2 * mtbf, mtbf) == mtbf  # checkpoints longer than 2 MTBF: checkpoint every MTBF


def test_run_time_equals_dalys_closed_form_and_its_parts_add_up():
    work, tau, delta, restart, mtbf = 30 * 86400.0, 2000.0, 300.0, 900.0, 3 * 3600.0
    run = expected_run(work, tau, delta, restart, mtbf)
    closed = mtbf * math.exp(restart / mtbf) * (math.exp((tau + delta) / mtbf) - 1) * work / tau
    assert run.wall_s == pytest.approx(closed, rel=1e-12)
    assert run.checkpoint_s == pytest.approx(work / tau * delta)
    assert run.interruptions == pytest.approx(closed / mtbf)
    assert run.effective_fraction == pytest.approx(work / closed)
    assert min(run.lost_work_s, run.restart_s) > 0


def test_a_run_that_never_gets_through_is_one_clear_error():
    # a restart 100 times the mean time between failures completes once in about e^100 tries:
    # an input error naming the failure rates, not an overflow (or a wall time of 1e150 days)
    with pytest.raises(InputError, match="the run never finishes: a restart takes") as caught:
        expected_run(86400.0, 2000.0, 300.0, 100 * 60.0, 60.0)
    assert caught.value.field == "reliability.failure_rates"
    with pytest.raises(InputError, match="a checkpoint interval and its write"):
        expected_run(86400.0, 1e7, 300.0, 10.0, 60.0)
    # at 40 times the run is long but finite, and priced
    assert math.isfinite(expected_run(86400.0, 2000.0, 300.0, 40 * 60.0, 60.0).wall_s)


def test_daly_interval_is_the_optimum_of_the_run_time():
    work, delta, restart, mtbf = 86400.0, 120.0, 600.0, 2 * 3600.0
    best = expected_run(work, daly_interval_s(delta, mtbf), delta, restart, mtbf).wall_s
    for scale in np.linspace(0.5, 2.0, 31):
        tau = scale * daly_interval_s(delta, mtbf)
        assert best <= expected_run(work, tau, delta, restart, mtbf).wall_s * (1 + 1e-6)


def test_closed_form_agrees_with_a_brute_force_renewal_simulation():
    """Poisson failures during work, checkpoints and restarts alike, simulated segment by segment."""
    tau, delta, restart, mtbf, segments = 1800.0, 200.0, 600.0, 3600.0, 40
    rng = np.random.default_rng(2024)
    walls = []
    for _ in range(1500):
        wall = 0.0
        for _ in range(segments):
            while True:
                failure = rng.exponential(mtbf)
                if failure >= tau + delta:
                    wall += tau + delta
                    break
                wall += failure
                while True:  # the restart itself must finish without failure
                    during = rng.exponential(mtbf)
                    if during >= restart:
                        wall += restart
                        break
                    wall += during
        walls.append(wall)
    expected = expected_run(segments * tau, tau, delta, restart, mtbf).wall_s
    assert np.mean(walls) == pytest.approx(expected, rel=0.015)


def test_published_rates_give_the_llama3_interruption_count_at_its_size():
    failures = job_failures(16_384, 2_048)
    assert failures.total_per_hour * 54 * 24 == pytest.approx(419)
    assert failures.per_hour["gpu"] * 54 * 24 == pytest.approx(268)
    assert set(PUBLISHED_RATES_PER_HOUR) == set(failures.per_hour)
    assert job_failures(1_024, 128).total_per_hour == pytest.approx(failures.total_per_hour / 16)


@pytest.fixture(scope="module")
def result():
    loaded = load_scenario(SCENARIO, RELIABLE)
    return simulate(loaded.scenario, loaded.path.parent)


def test_checkpoint_holds_every_parameter_once(result):
    # Llama 3 70B has 70.6 billion parameters (Meta's model card); bf16 weights + Adam state = 14 B each
    assert checkpoint_bytes(result) == pytest.approx(70.6e9 * 14, rel=0.01)


@pytest.mark.parametrize("impl,per_param", [("fsdp", 12), ("deepspeed", 14)])
def test_an_fsdp_checkpoint_saves_its_fp32_shards_once(impl, per_param):
    # PyTorch's FSDP keeps no bf16 weights beside its fp32 shards, which are Adam's master weights
    loaded = load_scenario(SCENARIO, [*RELIABLE, "cluster.nodes=8", "parallel.zero_stage=3", f"parallel.zero_impl={impl}"])
    result = simulate(loaded.scenario, loaded.path.parent)
    assert result.layout.weights_sharded
    assert checkpoint_bytes(result) == pytest.approx(70.6e9 * per_param, rel=0.01)


@pytest.mark.parametrize("tokens", [1e11, 2e12])
def test_more_failures_never_shorten_the_time_to_train(tokens):
    days = []
    for scale in (0.0, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0):
        rates = [f"reliability.failure_rates.{c}={PUBLISHED_RATES_PER_HOUR[c] * scale}" for c in PUBLISHED_RATES_PER_HOUR]
        loaded = load_scenario(SCENARIO, RELIABLE + rates)
        days.append(goodput(simulate(loaded.scenario, loaded.path.parent), tokens).days)
    assert all(a <= b for a, b in zip(days, days[1:])), days
    assert days[-1] > days[0]


def test_goodput_needs_storage_bandwidth_and_restart_time():
    loaded = load_scenario(SCENARIO, ["reliability.restart_time=10 min"])
    with pytest.raises(InputError, match="reliability.storage_bandwidth"):
        goodput(simulate(loaded.scenario, loaded.path.parent), 1e12)


def test_cli_goodput_json_and_plot(capsys, tmp_path):
    picture = tmp_path / "goodput.png"
    sets = [a for s in RELIABLE for a in ("--set", s)]
    assert main(["run", SCENARIO, "--json", "--goodput", "--tokens", "1e12", "--goodput-plot", str(picture), *sets]) == 0
    data = json.loads(capsys.readouterr().out)["goodput"]
    lost = data["lost_s"]
    assert data["wall_time_s"] == pytest.approx(data["steps"] * data["step_time_s"] + sum(lost.values()))
    assert 0 < data["effective_training_time"] < 1
    assert data["interruptions_per_day"] == pytest.approx(sum(data["interruptions_per_day_by_component"].values()))
    assert picture.stat().st_size > 0


def test_cli_refuses_goodput_without_tokens(capsys):
    assert main(["run", SCENARIO, "--goodput"]) == 2
    assert "--tokens" in capsys.readouterr().err


def test_a_job_without_failures_has_valid_json_and_no_lost_time(capsys):
    rates = [f"reliability.failure_rates.{c}=0" for c in PUBLISHED_RATES_PER_HOUR]
    sets = [a for s in RELIABLE + rates for a in ("--set", s)]
    assert main(["run", SCENARIO, "--json", "--goodput", "--tokens", "1e11", *sets]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert data["goodput"]["mtbf_s"] is None and data["goodput"]["effective_training_time"] == 1.0


@pytest.mark.parametrize("scenario, unit", [("vit_h14_32xa100.yaml", "images"),
                                            ("deepspeech2_8xa100.yaml", "audio seconds")])
def test_tokens_count_in_the_models_own_unit(scenario, unit):
    # --tokens of an image model counts images, of a speech model audio seconds: what its
    # throughput line counts, so a step holds global batch x that many
    loaded = load_scenario(str(SCENARIOS / scenario), RELIABLE)
    result = simulate(loaded.scenario)
    report = goodput(result, 1e9)
    summary_rate = summarize(result).throughput_per_s
    per_step = summary_rate * result.timeline.step_time_s
    assert report.unit == unit and report.steps == math.ceil(1e9 / per_step - 1e-9)
