"""Clusters of several systems: stages placed by rank order, priced and sized on their own part."""

from __future__ import annotations

import pytest
import yaml

from mpsim.cli import main
from mpsim.results.metrics import summarize
from mpsim.results.report import summary_json
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs.loader import load_scenario
from mpsim.specs.scenario import Scenario
from mpsim.specs.yamlio import read_yaml
from tests.conftest import SCENARIOS

HOMOGENEOUS = SCENARIOS / "llama3_70b_32xh100.yaml"  # TP 8 x PP 4 on 4 DGX H100: node n holds stage n
BETWEEN = {"nics_per_node": 8, "nic_bandwidth": "200 Gb/s", "efficiency": 0.9, "step_latency": "15 us"}


def write(tmp_path, cluster: dict, name: str = "mixed") -> str:
    """The homogeneous scenario with its cluster replaced."""
    tree = read_yaml(HOMOGENEOUS)
    tree["cluster"] = cluster
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def run(path, *overrides: str):
    result = simulate(load_scenario(path, list(overrides)).scenario)
    return result, summarize(result, bubble_reference(result))


def halves(tmp_path) -> str:
    """Stages 0-1 on two DGX A100 nodes, stages 2-3 on two DGX H100 nodes."""
    return write(tmp_path, {"parts": [{"system": "dgx-a100", "nodes": 2}, {"system": "dgx-h100", "nodes": 2}],
                            "between_parts": BETWEEN})


@pytest.mark.parametrize("split", ["even", "auto"])
def test_parts_of_one_system_equal_the_homogeneous_cluster(tmp_path, split):
    same = write(tmp_path, {"parts": [{"system": "dgx-h100", "nodes": 1}, {"system": "dgx-h100", "nodes": 3}]})
    overrides = ["parallel.layers_per_stage=auto"] if split == "auto" else []
    result, summary = run(same, *overrides)
    reference, reference_summary = run(str(HOMOGENEOUS), *overrides)
    assert summary.step_time_s == reference_summary.step_time_s
    assert summary_json(summary) == summary_json(reference_summary)
    assert result.timeline.actions == reference.timeline.actions


def test_each_stage_is_priced_on_its_own_part(tmp_path):
    result, _ = run(halves(tmp_path))
    a100, _ = run(write(tmp_path, {"system": "dgx-a100", "nodes": 4}, "a100"))
    h100, _ = run(str(HOMOGENEOUS))
    for stage, alone in ((0, a100), (1, a100), (2, h100), (3, h100)):
        for kind in ("F", "B"):
            assert result.costs[(stage, kind)].compute_s == alone.costs[(stage, kind)].compute_s
    assert result.costs[(1, "F")].compute_s > 1.5 * result.costs[(2, "F")].compute_s  # same layers, slower device


def test_auto_gives_the_faster_part_more_layers_and_beats_the_even_split(tmp_path):
    path = halves(tmp_path)
    _, even = run(path)
    _, auto = run(path, "parallel.layers_per_stage=auto")
    a100, h100 = auto.layers_per_stage[:2], auto.layers_per_stage[2:]
    assert sum(auto.layers_per_stage) == sum(even.layers_per_stage)
    assert min(h100) > max(a100)
    assert auto.step_time_s < even.step_time_s


def test_memory_is_checked_against_each_parts_capacity(tmp_path):
    path = write(tmp_path, {"parts": [{"system": {"base": "dgx-a100", "accelerator": "a100-sxm-40gb"}, "nodes": 2},
                                      {"system": "dgx-h100", "nodes": 2}], "between_parts": BETWEEN})
    result, summary = run(path)
    small, large = (part.system.accelerator.memory.capacity for part in result.scenario.cluster.parts)
    assert small < large
    capacity = [rank.capacity_bytes for rank in summary.memory]
    assert capacity == [small, small, large, large]
    # the 40 GB stages hold as much as the H100 ones, so they are the ones over their capacity
    assert summary.out_of_memory and summary.capacity_bytes == small
    assert [rank.fits for rank in summary.memory] == [False, False, True, True]


def test_the_summary_names_both_parts(tmp_path):
    _, summary = run(halves(tmp_path))
    assert summary.system == "2 dgx-a100 + 2 dgx-h100 nodes"
    assert "a100" in summary.accelerator and "h100" in summary.accelerator


@pytest.mark.parametrize("cluster, words", [
    ({"parts": [{"system": "dgx-a100", "nodes": 2}, {"system": "dgx-h100", "nodes": 2}]}, "need between_parts"),
    ({"parts": [{"system": "dgx-h100", "nodes": 4}], "nodes": 4}, "give either parts or nodes"),
    ({"parts": [{"system": "dgx-h100", "nodes": 4}], "system": "dgx-h100"}, "give either parts or system"),
    ({"parts": [{"system": "dgx-a100", "nodes": 2}, {"system": "gb200-nvl72", "nodes": 1}],
      "between_parts": BETWEEN}, "devices per node"),
    ({"parts": []}, "non-empty list"),
    ({"parts": "dgx-h100"}, "non-empty list"),
    ({"parts": [{"nodes": 4}]}, "parts.0: a part is a mapping with a system and nodes"),
    ({"parts": [{"system": "dgx-h100"}]}, "cluster.parts.0.nodes: required field is missing"),
    ({"parts": [{"system": "dgx-h100", "nodes": 0}]}, "greater than 0"),
    ({"parts": [{"system": "dgx-h100", "nodes": 4}], "between_parts": BETWEEN}, None),
])
def test_a_bad_cluster_gets_one_line_and_exit_code_2(tmp_path, capsys, cluster, words):
    code = main(["run", write(tmp_path, cluster)])
    err = capsys.readouterr().err.strip()
    if words is None:  # a single part with a network between parts is fine
        assert code == 0
        return
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and words in err, err


def test_a_pipeline_stage_split_over_two_parts_is_refused(tmp_path, capsys):
    path = write(tmp_path, {"parts": [{"system": "dgx-a100", "nodes": 1}, {"system": "dgx-h100", "nodes": 3}],
                            "between_parts": BETWEEN})
    assert main(["run", path]) == 0  # one node per stage: the A100 node holds stage 0
    assert main(["run", path, "--set", "parallel.pp=2"]) == 2  # stage 0 on the A100 node and an H100 node
    assert main(["run", path, "--set", "parallel.order=pp-tp-cp-dp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("cluster.parts: pipeline rank" in line for line in err)


def test_a_cluster_of_parts_reads_back_from_its_own_dump(tmp_path):
    # the planner and sweeps rebuild scenarios from model_dump(): system and nodes then sit beside parts
    scenario = load_scenario(halves(tmp_path)).scenario
    assert Scenario.model_validate(scenario.model_dump()) == scenario
    changed = scenario.model_dump()
    changed["cluster"]["nodes"] = 5  # no longer what the parts add up to
    with pytest.raises(ValueError, match="give either parts or system/nodes"):
        Scenario.model_validate(changed)


def test_one_part_of_the_cluster_is_set_by_its_number(tmp_path):
    path = halves(tmp_path)
    # the second part's system swapped for the first's: the same as writing it in the file
    swapped, _ = run(path, "cluster.parts.1.system=dgx-a100")
    written, _ = run(write(tmp_path, {"parts": [{"system": "dgx-a100", "nodes": 2}, {"system": "dgx-a100", "nodes": 2}],
                                      "between_parts": BETWEEN}, name="written"))
    assert swapped.timeline.step_time_s == written.timeline.step_time_s
    # a field inside a part's referenced system file, reached through the list
    slower = load_scenario(path, ["cluster.parts.0.system.scale_out.nic_bandwidth=100 Gb/s"]).scenario
    assert slower.cluster.parts[0].system.scale_out.nic_bandwidth == 100e9 / 8
    assert slower.cluster.parts[1].system.name == "dgx-h100"


@pytest.mark.parametrize("field", ["cluster.parts.2.nodes=1", "cluster.parts.x.nodes=1"])
def test_a_part_number_out_of_range_is_one_line(tmp_path, field, capsys):
    assert main(["run", halves(tmp_path), "--set", field]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "list of 2 item(s)" in err and "Traceback" not in err


def test_each_rank_reserves_what_its_own_part_does(tmp_path):
    # A100 nodes run 24 NCCL channels, H100 nodes 16 (their system files): each pipeline rank's
    # reserved memory follows its own part, not the first part's
    from mpsim.specs.catalog import load_system

    _, summary = run(halves(tmp_path))
    channels = [load_system(name).collective_channels for name in ("dgx-a100", "dgx-a100", "dgx-h100", "dgx-h100")]
    for memory, count in zip(summary.memory, channels):
        assert f"; {count} channels each)" in memory.reserved_parts[-1][0]
    assert summary.memory[0].reserved_bytes != summary.memory[-1].reserved_bytes


def test_the_summary_gives_each_parts_reserved_memory(tmp_path, capsys):
    # A100 nodes run 24 NCCL channels per communicator and H100 nodes 16 (their systems'
    # files): each pipeline rank's line names what its own part reserves
    assert main(["run", halves(tmp_path)]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if "reserved per device" in line]
    assert [line.split(":")[0] for line in lines] == ["reserved per device, ranks 0,1", "reserved per device, ranks 2,3"]
    assert "24 channels each" in lines[0] and "16 channels each" in lines[1]
    # one line, without ranks, where every rank reserves the same
    assert main(["run", str(HOMOGENEOUS)]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if "reserved per device" in line]
    assert len(lines) == 1 and lines[0].startswith("reserved per device: ")


def test_the_automatic_split_budgets_each_part_with_its_own_reserved_memory(tmp_path):
    # a part whose NCCL runs one channel reserves less than one running dgx-a100's channels; each
    # stage's budget takes off its own part's reserve, as the memory table does
    path = write(tmp_path, {"parts": [{"system": {"base": "dgx-a100", "collective_channels": 1}, "nodes": 2},
                                      {"system": {"base": "dgx-a100", "accelerator": "a100-sxm-40gb"}, "nodes": 2}],
                            "between_parts": BETWEEN})
    from mpsim.balance.auto import partition_problem
    from mpsim.resolve import resolve
    from mpsim.workload.memory import reserved_parts

    scenario = load_scenario(path, ["parallel.layers_per_stage=auto"]).scenario
    layout = resolve(scenario)
    budgets = partition_problem(scenario, layout).stage_capacity_bytes
    reserves = [sum(size for _, size in reserved_parts(scenario, layout, part.system))
                for part in scenario.cluster.parts]
    capacities = [part.system.accelerator.memory.capacity for part in scenario.cluster.parts]
    assert reserves[0] < reserves[1]
    # what the budget takes off besides the reserve is the same on both parts
    others = [capacities[part] - budgets[stage] - reserves[part] for stage, part in ((0, 0), (1, 0), (2, 1), (3, 1))]
    assert others == pytest.approx([others[0]] * 4)
