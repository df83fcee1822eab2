"""Degraded parts: a slow GPU, node or link at a fraction of its speed (docs/heterogeneous.md)."""

from __future__ import annotations

import pytest

from mpsim.cli import main
from mpsim.results.metrics import summarize
from mpsim.results.report import summary_json
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs.loader import load_scenario
from tests.conftest import SCENARIOS

# Llama 3 70B on 4 DGX H100 nodes: TP 8 inside a node, PP 4 across them (node n holds stage n)
PIPELINE = str(SCENARIOS / "llama3_70b_32xh100.yaml")
# Llama 3 8B on 8 nodes: TP 8, PP 1, DP 8 (node n holds data-parallel replica n)
DATA_PARALLEL = str(SCENARIOS / "llama3_8b_64xh100_dp8.yaml")


def run(path: str, *overrides: str):
    result = simulate(load_scenario(path, list(overrides)).scenario)
    return result, summarize(result, bubble_reference(result))


@pytest.fixture(scope="module")
def healthy():
    return run(PIPELINE)


def test_a_speed_of_one_changes_nothing_bit_for_bit(healthy):
    result, summary = healthy
    for fault in ("faults.slow_gpu=5@1.0", "faults.slow_node=2@1", "faults.slow_link=1:nic@1.0"):
        faulty, faulty_summary = run(PIPELINE, fault)
        assert summary_json(faulty_summary) == summary_json(summary)
        assert faulty.timeline.actions == result.timeline.actions


def test_a_slow_gpu_slows_its_own_stage_by_the_fraction(healthy):
    result, _ = healthy
    slow, _ = run(PIPELINE, "faults.slow_gpu=31@0.5")  # rank 31: the last node, pipeline rank 3
    for stage in range(4):
        ratio = slow.costs[(stage, "F")].compute_s / result.costs[(stage, "F")].compute_s
        assert ratio == pytest.approx(2.0 if stage == 3 else 1.0, rel=1e-12)


def test_slower_is_never_faster_and_half_speed_costs_time(healthy):
    _, summary = healthy
    steps = [run(PIPELINE, f"faults.slow_gpu=9@{speed}")[1].step_time_s for speed in (1.0, 0.9, 0.7, 0.5, 0.3)]
    assert steps == sorted(steps)
    assert steps[3] > summary.step_time_s * 1.2


def test_the_other_stages_wait_for_the_slow_one_as_imbalance(healthy):
    _, summary = healthy
    _, slow = run(PIPELINE, "faults.slow_gpu=9@0.5")  # rank 9: pipeline rank 1
    assert slow.bubble_imbalance_s > summary.bubble_imbalance_s + 1.0
    idle = [rank.idle_s for rank in slow.ranks]
    assert idle.index(min(idle)) == 1  # the slow stage is the one that never waits


def test_auto_balancing_moves_layers_off_the_slow_stage():
    _, even = run(PIPELINE, "faults.slow_gpu=9@0.5")
    _, auto = run(PIPELINE, "faults.slow_gpu=9@0.5", "parallel.layers_per_stage=auto")
    layers = auto.layers_per_stage
    assert layers[1] == min(layers) < 20 and sum(layers) == 80
    assert auto.step_time_s < even.step_time_s


def test_a_slow_node_is_its_gpus_slow():
    _, node = run(PIPELINE, "faults.slow_node=2@0.6")
    _, gpu = run(PIPELINE, "faults.slow_gpu=16@0.6")  # rank 16 lies on node 2
    assert node.step_time_s == gpu.step_time_s


def test_any_replica_of_a_stage_limits_the_step_the_same_way():
    # the gradient all-reduce waits for the slowest replica, whichever one it is
    first = run(DATA_PARALLEL, "faults.slow_gpu=0@0.5")[1].step_time_s
    last = run(DATA_PARALLEL, "faults.slow_gpu=63@0.5")[1].step_time_s
    healthy = run(DATA_PARALLEL)[1].step_time_s
    assert first == last > healthy


def test_a_slow_nic_slows_the_gradient_reduction_and_a_slow_nvlink_the_tensor_parallel_collectives():
    _, healthy = run(DATA_PARALLEL)
    _, nic = run(DATA_PARALLEL, "faults.slow_link=3:nic@0.5")
    _, nvlink = run(DATA_PARALLEL, "faults.slow_link=3:nvlink@0.5")
    assert nic.exposed_dp_comm_s > healthy.exposed_dp_comm_s
    assert nic.exposed_tp_comm_s == healthy.exposed_tp_comm_s
    assert nvlink.exposed_tp_comm_s > healthy.exposed_tp_comm_s
    assert nic.step_time_s > healthy.step_time_s and nvlink.step_time_s > healthy.step_time_s


def test_the_long_form_equals_the_short_one():
    short = run(PIPELINE, "faults.slow_gpu=9@0.5")[1]
    long = run(PIPELINE, "faults.slow_gpu=[{rank: 9, speed: 0.5}]")[1]
    assert summary_json(short) == summary_json(long)


@pytest.mark.parametrize("override, words", [
    ("faults.slow_gpu=32@0.5", "0.rank: rank 32 does not exist"),
    ("faults.slow_gpu=3@0", "greater than 0"),
    ("faults.slow_gpu=3@1.5", "less than or equal to 1"),
    ("faults.slow_gpu=three", "not of the form '12@0.5'"),
    ("faults.slow_node=4@0.5", "node 4 does not exist"),
    ("faults.slow_link=1:pcie@0.5", "'nvlink' or 'nic'"),
    ("faults.slow_link=1@0.5", "not of the form '1:nic@0.5'"),
    ("faults.slow_disk=1@0.5", "unknown field"),
])
def test_a_bad_fault_gets_one_line_and_exit_code_2(override, words, capsys):
    assert main(["run", PIPELINE, "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and words in err and "faults" in err


def test_fault_entries_built_in_python_are_taken_as_they_are():
    # the short forms and mappings of a file, and entries built already: the same spec either way
    from mpsim.specs.faults import FaultsSpec, SlowGpu

    built = FaultsSpec(slow_gpu=[SlowGpu(rank=1, speed=0.5)])
    assert built == FaultsSpec(slow_gpu=["1@0.5"]) == FaultsSpec.model_validate(built.model_dump())
    with pytest.raises(ValueError, match="rank 1 is given twice"):
        FaultsSpec(slow_gpu=[SlowGpu(rank=1, speed=0.5), "1@0.7"])
