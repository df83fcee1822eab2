"""Step-time distributions: seeded op-time draws, the slowest DP replica from order statistics,
and the zero-variance run that must equal the deterministic one to the bit."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from mpsim.cli import main
from mpsim.errors import InputError
from mpsim.reliability.op_variation import OP_KINDS, op_cvs
from mpsim.reliability.order_stats import Lognormal, PointMass, Spliced, max_of_replicas, replica_distribution
from mpsim.reliability.report import step_distribution
from mpsim.reliability.sampling import action_shares, lognormal_factors, sample_replica
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

SMALL = str(SCENARIOS / "llama3_8b_64xh100_dp8.yaml")
CV = {"gemm": 0.03, "attention": 0.04, "memory": 0.02, "collective": 0.08, "transfer": 0.1}
ZERO_CV = [f"variability.cv.{kind}=0" for kind in OP_KINDS]


def _percentiles(values: np.ndarray) -> np.ndarray:
    return np.percentile(values, [50, 99])


@pytest.mark.parametrize("replicas", [1, 2, 8, 64])
def test_order_statistics_match_brute_force_maximum(replicas):
    """F^-1(U^(1/n)) against the maximum of n explicit lognormal draws: within 1 % at p50 and p99."""
    distribution = Lognormal(mu=0.5, sigma=0.2)
    drawn = max_of_replicas(distribution, replicas, 40_000, np.random.default_rng(11))
    explicit = np.random.default_rng(12).lognormal(0.5, 0.2, size=(40_000, replicas)).max(axis=1)
    ratio = _percentiles(drawn) / _percentiles(explicit)
    assert np.all(np.abs(ratio - 1.0) < 0.01), ratio


def test_order_statistics_of_a_huge_group_stay_finite_and_grow():
    """With thousands of replicas the tail 1 - U^(1/n) is tiny; the draws stay finite and the p50 grows with n."""
    distribution = Lognormal(mu=0.0, sigma=0.05)
    medians = [np.median(max_of_replicas(distribution, n, 2_000, np.random.default_rng(1))) for n in (8, 512, 16384)]
    assert all(math.isfinite(m) for m in medians)
    assert medians[0] < medians[1] < medians[2]
    # the median of the max of n is F^-1(0.5^(1/n)), here computed directly in the plain form
    assert medians[2] == pytest.approx(math.exp(0.05 * NormalDist().inv_cdf(0.5 ** (1 / 16384))), rel=2e-3)


def test_point_mass_maximum_is_the_value_itself():
    values = np.full(5, 1.25)
    distribution = replica_distribution(values)
    assert isinstance(distribution, PointMass)
    assert np.all(max_of_replicas(distribution, 64, 100, np.random.default_rng(0)) == 1.25)


def test_lognormal_factors_have_mean_one_and_the_asked_cv():
    factors = lognormal_factors(np.random.default_rng(5), 0.1, 200_000)
    assert factors.mean() == pytest.approx(1.0, abs=1e-3)
    assert factors.std() / factors.mean() == pytest.approx(0.1, rel=0.02)
    assert np.all(lognormal_factors(np.random.default_rng(5), 0.0, 10) == 1.0)


@pytest.fixture(scope="module")
def small_result():
    loaded = load_scenario(SMALL, [f"variability.cv.{kind}={value}" for kind, value in CV.items()])
    return simulate(loaded.scenario, loaded.path.parent)


def test_shares_of_every_action_sum_to_one(small_result):
    shares = action_shares(small_result)
    assert set(shares) == set(small_result.engine_input.action_s)
    for key, share in shares.items():
        assert sum(share.values()) == pytest.approx(1.0), key
        assert share.get("gemm", 0) > 0.3  # a transformer pass is mostly GEMMs


def test_same_seed_same_samples_other_seed_other_samples(small_result):
    cv = op_cvs(small_result.scenario)
    assert cv == CV
    first = sample_replica(small_result, cv, 12, seed=7)
    again = sample_replica(small_result, cv, 12, seed=7)
    other = sample_replica(small_result, cv, 12, seed=8)
    assert first.step_time_s == again.step_time_s
    assert first.step_time_s != other.step_time_s
    assert len(set(first.step_time_s)) == 12  # every draw differs
    d1, d2 = step_distribution(first, small_result.layout.dp), step_distribution(again, small_result.layout.dp)
    assert d1.job == d2.job and d1.replica == d2.replica
    # the job waits for the slowest of its 8 replicas: its median is above one replica's
    assert d1.job.p50_s > d1.replica.p50_s


def test_real_replica_order_statistics_match_explicit_replicas(small_result):
    """The replica distribution of a real scenario: order statistics against n explicit replicas
    drawn from the same distribution (inverse transform of uniform draws)."""
    samples = sample_replica(small_result, CV, 30, seed=3)
    fitted = replica_distribution(np.asarray(samples.step_time_s))
    assert isinstance(fitted, Spliced) and fitted.tail_fit.sigma > 0
    dp = small_result.layout.dp
    drawn = max_of_replicas(fitted, dp, 40_000, np.random.default_rng(21))
    uniform = np.random.default_rng(22).uniform(size=40_000 * dp)
    explicit = fitted.upper_quantile(1.0 - uniform).reshape(40_000, dp).max(axis=1)
    assert np.all(np.abs(_percentiles(drawn) / _percentiles(explicit) - 1.0) < 0.01)


def test_the_slowest_of_several_replicas_is_never_faster_than_one(small_result):
    # a heavy variation (cv 1 on GEMMs) makes the replica's tail heavier than a lognormal's: a
    # lognormal fitted to all of it put the job's p99 below the replica's
    heavy = {**CV, "gemm": 1.0}
    distribution = step_distribution(sample_replica(small_result, heavy, 400, seed=7), small_result.layout.dp)
    for name in ("p50_s", "p90_s", "p99_s", "mean_s", "max_s"):
        assert getattr(distribution.job, name) >= getattr(distribution.replica, name), name
    # one replica's job is that replica, exactly
    one = step_distribution(sample_replica(small_result, heavy, 50, seed=7), 1)
    assert one.job == one.replica


def test_the_spliced_tail_is_the_samples_inside_and_the_lognormal_beyond():
    values = np.array([1.0, 1.1, 1.2, 1.3, 2.0])
    fitted = replica_distribution(values)
    assert fitted.upper_quantile(np.array([0.5]))[0] == pytest.approx(np.quantile(values, 0.5))
    far = fitted.upper_quantile(np.array([1e-6, 1e-9]))
    assert far[0] >= 2.0 and far[1] >= far[0]  # never below the largest sample, growing further out


def test_missing_cv_is_an_input_error_naming_the_field():
    loaded = load_scenario(SMALL, ["variability.cv.gemm=0.02"])
    with pytest.raises(InputError, match="variability.cv.attention"):
        op_cvs(loaded.scenario)


def test_zero_variance_json_is_identical_to_the_deterministic_run(capsys):
    assert main(["run", SMALL, "--json"]) == 0
    plain = capsys.readouterr().out
    assert main(["run", SMALL, "--json", "--samples", "1", *[a for s in ZERO_CV for a in ("--set", s)]]) == 0
    sampled = json.loads(capsys.readouterr().out)
    distribution = sampled.pop("step_distribution")
    assert json.dumps(sampled, indent=2) + "\n" == plain
    step = sampled["step_time_s"]
    for view in ("replica", "job"):
        assert all(value == step for value in distribution[view].values())


def test_cli_reports_percentiles_and_draws_the_histogram(capsys, tmp_path):
    picture = tmp_path / "distribution.png"
    sets = [a for kind, value in CV.items() for a in ("--set", f"variability.cv.{kind}={value}")]
    assert main(["run", SMALL, "--samples", "8", "--seed", "4", "--distribution-plot", str(picture), *sets]) == 0
    out = capsys.readouterr().out
    assert "step-time distribution (8 samples, seed 4" in out and "job (max of 8)" in out
    assert picture.stat().st_size > 0


def test_cli_refuses_a_seed_without_samples(capsys):
    assert main(["run", SMALL, "--seed", "3"]) == 2
    assert "--seed" in capsys.readouterr().err


def test_transfer_variation_reaches_a_run_whose_links_are_shared():
    """With shared links the engine times a pipeline send by its link spec, not by the transfer
    table: both are drawn alike, so pipeline transfers that vary make a contended step vary
    (Megatron 1T: TP 8 x PP 64 over the NICs, DP reductions sharing them). Nothing else varies;
    the draws have mean 1, so the nominal step lies between the fastest and the slowest."""
    scenario = load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml").scenario
    result = simulate(scenario)
    assert result.engine_input.transfer_links
    cv = {kind: 0.0 for kind in OP_KINDS} | {"transfer": 0.3}
    samples = sample_replica(result, cv, 8, seed=0).step_time_s
    assert len(set(samples)) > 1
    assert min(samples) < result.timeline.step_time_s < max(samples)
