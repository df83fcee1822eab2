"""End-to-end: shipped scenarios load and simulate; more capable hardware is never slower."""

from __future__ import annotations

import pytest

from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

SHIPPED = sorted(p.name for p in SCENARIOS.glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_simulate(name):
    summary = summarize(simulate(load_scenario(SCENARIOS / name).scenario))
    assert summary.step_time_s > 0
    assert 0 < summary.mfu < 1
    assert 0 <= summary.bubble_fraction < 1


def step(name: str, *overrides: str) -> float:
    return simulate(load_scenario(SCENARIOS / name, list(overrides)).scenario).timeline.step_time_s


@pytest.mark.parametrize("name", ["gpt3_175b_64xa100.yaml", "llama3_70b_32xh100.yaml"])
@pytest.mark.parametrize("field,factor", [
    ("cluster.system.scale_up.bandwidth_per_device", 2.0),
    ("cluster.system.scale_out.nic_bandwidth", 2.0),
    ("cluster.system.accelerator.memory.bandwidth", 2.0),
])
def test_more_bandwidth_is_never_slower(name, field, factor):
    loaded = load_scenario(SCENARIOS / name)
    node = loaded.scenario
    for part in field.split("."):
        node = getattr(node, part)
    assert step(name, f"{field}={node * factor}") <= step(name) + 1e-12


def test_faster_accelerator_is_never_slower():
    base = step("llama3_70b_32xh100.yaml")
    assert step("llama3_70b_32xh100.yaml", "cluster.system.accelerator.peak_flops.bf16=2e15") <= base


def test_overrides_reach_into_referenced_files():
    loaded = load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml",
                           ["cluster.system.scale_out.nic_bandwidth=400 Gb/s", "parallel.tp=4", "cluster.nodes=4"])
    assert loaded.scenario.cluster.system.scale_out.nic_bandwidth == pytest.approx(50e9)
    assert loaded.scenario.parallel.tp == 4
    assert loaded.origins.file_for(("parallel", "tp"))[0] == "--set parallel.tp=4"
    assert loaded.origins.file_for(("cluster", "system", "accelerator", "memory"))[0].endswith("a100_sxm_80gb.yaml")


def test_switching_system_by_override():
    loaded = load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml", ["cluster.system=dgx-h100"])
    assert loaded.scenario.cluster.system.accelerator.name == "h100-sxm-80gb"
    assert step("gpt3_175b_64xa100.yaml", "cluster.system=dgx-h100") < step("gpt3_175b_64xa100.yaml")


def test_simulation_is_deterministic():
    first = summarize(simulate(load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml").scenario))
    second = summarize(simulate(load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml").scenario))
    assert first == second


def test_out_of_memory_is_reported():
    summary = summarize(simulate(load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml",
                                               ["parallel.recompute=none", "parallel.sequence_parallel=false"]).scenario))
    assert summary.out_of_memory
    assert summary.memory[0].largest_category == "activations"
