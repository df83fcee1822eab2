"""The network model inside whole simulations: faster networks never slow a step, and DP pays for its bytes."""

from __future__ import annotations

import pytest

from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

DP_HEAVY = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"


def run(path, *overrides: str):
    return summarize(simulate(load_scenario(path, list(overrides)).scenario))


@pytest.mark.parametrize("name", ["llama3_8b_64xh100_dp8.yaml", "llama3_70b_32xh100.yaml", "gpt3_175b_64xa100.yaml"])
def test_network_bandwidth_sweep_never_raises_the_step_time(name):
    steps = [simulate(load_scenario(SCENARIOS / name, [f"cluster.system.scale_out.nic_bandwidth={gbps} Gb/s"])
                      .scenario).timeline.step_time_s for gbps in (50, 100, 200, 400, 800, 1600)]
    assert all(later <= earlier + 1e-12 for earlier, later in zip(steps, steps[1:])), steps
    assert steps[-1] < steps[0]  # and the sweep matters for these layouts


def test_doubling_inter_node_bandwidth_shortens_only_the_exposed_dp_part():
    base = run(DP_HEAVY)
    fast = run(DP_HEAVY, "cluster.system.scale_out.nic_bandwidth=800 Gb/s")
    assert base.dp == 8 and base.pp == 1
    assert fast.exposed_dp_comm_s < 0.5 * base.exposed_dp_comm_s
    saved = base.step_time_s - fast.step_time_s
    assert saved > 0.05
    assert saved == pytest.approx(base.exposed_dp_comm_s - fast.exposed_dp_comm_s, rel=1e-6)
    assert fast.exposed_tp_comm_s == pytest.approx(base.exposed_tp_comm_s, rel=1e-12)
    assert fast.exposed_pp_comm_s == pytest.approx(base.exposed_pp_comm_s, abs=1e-12)
    assert [r.compute_s for r in fast.ranks] == pytest.approx([r.compute_s for r in base.ranks], rel=1e-12)


def test_oversubscription_only_matters_where_the_job_climbs_the_fat_tree():
    # 8 nodes sit under one leaf group of 32: a 4:1 taper above it changes nothing
    assert run(DP_HEAVY, "cluster.system.scale_out.oversubscription=4").step_time_s == run(DP_HEAVY).step_time_s
    # 64 nodes (dp 64) span two scalable units: the taper slows the gradient all-reduce
    wide = ["cluster.nodes=64", "parallel.dp=64", "parallel.global_batch_size=512"]
    assert run(DP_HEAVY, *wide, "cluster.system.scale_out.oversubscription=4").exposed_dp_comm_s > \
        run(DP_HEAVY, *wide).exposed_dp_comm_s
