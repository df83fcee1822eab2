"""The network at scale: oversubscription, where groups and their copies sit, a RoCE cluster, partly filled domains.

``mpsim collective``, the simulator's collectives and pipeline sends reach the network through one
function (``collectives.network_link``); a group of a layout stands for all its copies and is priced
as the slowest of them.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from mpsim.cost.collectives import collective_time, network_taper_of, p2p_time, priced_copies
from mpsim.cost.groups import group_placements
from mpsim.cost.topology import copy_shapes, lattice_dims, pipeline_pair, place_ranks, placement_warnings
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.catalog import load_system
from tests.conftest import ROOT, SCENARIOS, CliRun, run_in_process

DP_HEAVY = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
GPT3 = SCENARIOS / "gpt3_175b_64xa100.yaml"
ONE_BUCKET = "training.grad_reduce_bucket_bytes=1 TB"  # the whole gradient in one all-reduce


def run_cli(*args: str) -> CliRun:
    return run_in_process(args, ROOT)


def cli_seconds(output: str) -> list[float]:
    """The time column of ``mpsim collective``'s rows, in seconds."""
    return [float(line.split()[4]) * 1e-6 for line in output.splitlines() if line and not line.startswith("#")]


def layout_of(path, *overrides: str):
    scenario = load_scenario(path, list(overrides)).scenario
    return scenario, resolve(scenario)


# --- one code path for the CLI and the simulator ----------------------------------------------------------

@pytest.mark.parametrize("oversubscription", [1, 4])
def test_collective_cli_and_the_simulator_price_a_dp_bucket_alike(oversubscription):
    taper = f"scale_out.oversubscription={oversubscription}"
    result = simulate(load_scenario(DP_HEAVY, ["cluster.nodes=64", "parallel.dp=64", "parallel.global_batch_size=512",
                                               ONE_BUCKET, f"cluster.system.{taper}"]).scenario)
    buckets = result.engine_input.grad_buckets[0]
    assert len(buckets) == 1
    grad_bytes = result.workload.stages[0].params * 4  # fp32 gradients of the rank's parameters
    cli = run_cli("collective", "--system", "dgx-h100", "--op", "all-reduce", "--ranks", "64", "--nodes", "64",
                  "--size", f"{grad_bytes:.0f}B", "--set", taper)
    assert cli.returncode == 0, cli.stderr
    assert f"oversubscription felt {oversubscription}:1" in cli.stdout  # 64 nodes span two scalable units of 32
    assert cli_seconds(cli.stdout) == [pytest.approx(buckets[0].duration_s, rel=1e-5)]


def test_a_tapered_network_slows_the_dp_bucket_by_the_taper():
    seconds = {}
    for oversubscription in (1, 4):
        cli = run_cli("collective", "--system", "dgx-h100", "--ranks", "64", "--nodes", "64", "--size", "4GB",
                      "--set", f"scale_out.oversubscription={oversubscription}")
        seconds[oversubscription] = cli_seconds(cli.stdout)[0]
    # a 4 GB all-reduce is bandwidth-bound: a quarter of the uplink bandwidth, about four times as long
    assert seconds[4] / seconds[1] == pytest.approx(4, rel=0.05)


# --- a group stands for its copies ------------------------------------------------------------------------

def test_groups_know_their_copies():
    assert lattice_dims([0, 8, 16, 24]) == ((8, 4),)
    assert lattice_dims([0, 1, 2, 3, 64, 65, 66, 67]) == ((1, 4), (64, 2))
    assert lattice_dims([0, 1, 2, 4, 5, 6]) == ()  # not a dimension of the rank numbering
    # TP groups of 16 on 72-GPU domains: most sit in one domain, the one at ranks 64-79 spans two
    tp16 = place_ranks(list(range(16)), 72, world=144)
    assert [(copy.nodes, copy.per_node) for copy in copy_shapes(tp16, 72)] == [(1, 16), (2, 8)]
    # without the job's size a group is priced where it sits, as mpsim collective places it
    assert copy_shapes(place_ranks(list(range(16)), 72), 72) == (place_ranks(list(range(16)), 72),)


def test_a_dp_group_inside_one_leaf_is_priced_as_its_copy_that_straddles_two():
    # GPT-3 on 64 DGX A100 (TP 8 x PP 8 x DP 8): each stage's DP group spans 8 nodes; scalable units
    # hold 20 nodes, so stage 0's group stays under one leaf while stage 2's (nodes 16-23) crosses
    scenario, layout = layout_of(GPT3, "cluster.nodes=64", "cluster.system.scale_out.oversubscription=4")
    system = scenario.cluster.system
    dp = group_placements(layout)["dp"]
    assert dp.node_ids(8) == list(range(8)) and network_taper_of(dp, system) == 1.0
    assert max(network_taper_of(copy, system) for copy in priced_copies(dp, system)) == 4.0
    alone = place_ranks(list(dp.ranks), 8)  # the same group without its copies
    assert collective_time("all-reduce", 1e9, dp, system) > 3.5 * collective_time("all-reduce", 1e9, alone, system)
    flat = load_system("dgx-a100")
    assert collective_time("all-reduce", 1e9, dp, flat) == collective_time("all-reduce", 1e9, alone, flat)


def test_a_multi_node_dp_step_is_slower_with_oversubscription():
    runs = {o: summarize(simulate(load_scenario(GPT3, ["cluster.nodes=64",
                                                       f"cluster.system.scale_out.oversubscription={o}"]).scenario))
            for o in (1, 4)}
    assert runs[4].dp == runs[1].dp == 8
    # the gradient all-reduce of the straddling DP groups is four times as slow, and most of it shows
    assert runs[4].exposed_dp_comm_s > 2 * runs[1].exposed_dp_comm_s
    assert runs[4].step_time_s > runs[1].step_time_s + 0.5 * (runs[4].exposed_dp_comm_s - runs[1].exposed_dp_comm_s)
    # inside one scalable unit nothing climbs: the taper changes nothing
    small = [summarize(simulate(load_scenario(GPT3, [f"cluster.system.scale_out.oversubscription={o}"]).scenario))
             .step_time_s for o in (1, 4)]
    assert small[0] == small[1]


# --- pipeline sends ---------------------------------------------------------------------------------------

def test_pipeline_sends_across_scalable_units_feel_the_taper():
    # Llama 3 70B on 64 DGX H100 (TP 8 x PP 4 x DP 16): stages 1 and 2 sit in different scalable units
    flat_scenario, layout = layout_of(SCENARIOS / "llama3_70b_32xh100.yaml", "cluster.nodes=64")
    flat = flat_scenario.cluster.system
    tapered = load_system("dgx-h100", ["scale_out.oversubscription=4"])
    size = 134e6  # one microbatch's activation, about
    across, inside = pipeline_pair(layout, 1, 2), pipeline_pair(layout, 0, 1)
    assert network_taper_of(across, tapered) == 4.0 and network_taper_of(inside, tapered) == 1.0
    wire = size / (50e9 * 0.97)  # one rank's 400G NIC at NCCL's efficiency
    assert p2p_time(size, across, tapered) - p2p_time(size, across, flat) == pytest.approx(3 * wire, rel=1e-9)
    assert p2p_time(size, inside, tapered) == p2p_time(size, inside, flat) == p2p_time(size, False, tapered)
    # neighbours in one node stay on NVLink
    assert p2p_time(size, place_ranks([0, 1], 8), tapered) == p2p_time(size, True, tapered)


# --- a RoCE cluster ---------------------------------------------------------------------------------------

def test_roce_cluster_is_non_blocking_inside_a_pod_and_tapered_across_pods():
    roce, ib = load_system("h100-roce-clos"), load_system("dgx-h100")
    within = place_ranks([node * 8 for node in range(256)], 8)  # 256 nodes: inside one 384-node pod
    across = place_ranks([node * 8 for node in range(512)], 8)  # 512 nodes: two pods
    size = 4e9
    assert collective_time("all-reduce", size, within, roce) == collective_time("all-reduce", size, within, ib)
    assert network_taper_of(across, roce) == 7.0 and network_taper_of(across, ib) == 1.0
    assert collective_time("all-reduce", size, across, roce) > 5 * collective_time("all-reduce", size, across, ib)


def test_roce_cluster_in_a_whole_simulation():
    def step(system: str, nodes: int) -> float:
        scenario = load_scenario(DP_HEAVY, [f"cluster.system={system}", f"cluster.nodes={nodes}", f"parallel.dp={nodes}",
                                            f"parallel.global_batch_size={8 * nodes}"]).scenario
        return summarize(simulate(scenario)).step_time_s

    assert step("h100-roce-clos", 256) == step("dgx-h100", 256)  # one pod: the same non-blocking network
    assert step("h100-roce-clos", 512) > 1.5 * step("dgx-h100", 512)  # two pods: the 1:7 aggregation layer


# --- jobs that partly fill NVL72 domains ------------------------------------------------------------------

def test_placement_warnings():
    def warnings(system: str, *overrides: str) -> list[str]:
        scenario, layout = layout_of(SCENARIOS / "mixtral_8x7b_64xh100.yaml", f"cluster.system={system}", *overrides)
        return placement_warnings(layout.devices, layout.devices_per_node, scenario.cluster.system.name,
                                  group_placements(layout))

    nvl = ["cluster.nodes=null", "parallel.pp=1", "parallel.tp=1", "parallel.etp=1"]
    assert warnings("gb200-nvl72", *nvl, "cluster.num_devices=144", "parallel.ep=8",
                    "parallel.global_batch_size=144") == []
    partial = warnings("gb200-nvl72", *nvl, "cluster.num_devices=64", "parallel.ep=8", "parallel.global_batch_size=64")
    assert len(partial) == 1 and "64 of its 72 devices" in partial[0]
    straddle = warnings("gb200-nvl72", *nvl, "cluster.num_devices=144", "parallel.ep=16",
                        "model.moe.num_experts=16", "parallel.global_batch_size=144")
    assert len(straddle) == 1 and "EP groups of 16" in straddle[0] and "span 2 domains" in straddle[0]
    # a group of 8 on 8-device servers that still spans two: TP 2 ranks sit between its members
    apart = warnings("dgx-h100")
    assert len(apart) == 1 and "EP groups of 8" in apart[0] and "2 devices apart" in apart[0]
    assert "spans 16 devices" in apart[0] and "EP size x 2 within 8" in apart[0]
    # part of one 8-GPU server is an ordinary job
    assert warnings("dgx-h100", *nvl, "cluster.num_devices=4", "parallel.ep=4", "parallel.global_batch_size=4") == []


def test_plan_warns_once_of_a_partly_filled_domain(tmp_path):
    model = tmp_path / "small.yaml"
    model.write_text("name: gpt-small\nnum_layers: 4\nhidden_size: 1024\nffn_hidden_size: 4096\n"
                     "num_attention_heads: 16\nvocab_size: 32000\nseq_length: 1024\n")

    def plan(devices: int) -> CliRun:
        return run_cli("plan", str(model), "--cluster", "gb200-nvl72", "--devices", str(devices), "--global-batch",
                       str(devices), "--workers", "1", "--schedules", "1f1b", "--max-microbatch", "1", "--top", "1")

    partial = plan(76)
    assert partial.returncode == 0, partial.stderr
    lines = partial.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "4 of its 72 devices" in lines[0]
    whole = plan(72)
    assert whole.returncode == 0 and whole.stderr.strip() == ""


def test_run_prints_one_warning_line_on_stderr(tmp_path):
    scenario = tmp_path / "nvl.yaml"
    scenario.write_text(textwrap.dedent("""\
        name: part of an NVL72 rack
        cluster:
          system: gb200-nvl72
          num_devices: 64
        model: mixtral-8x7b
        parallel:
          tp: 1
          pp: 1
          ep: 16
          microbatch_size: 1
          global_batch_size: 64
          schedule: 1f1b
        training:
          dtype: bf16
          attention: flash
        """))
    result = run_cli("run", str(scenario), "--set", "model.moe.num_experts=16", "--json")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ")
    assert "64 of its 72 devices" in lines[0]
    assert re.search(r'"step_time_s": [0-9.]+', result.stdout)  # the JSON on stdout is untouched
    whole = run_cli("run", str(scenario), "--set", "cluster.num_devices=72", "--set", "parallel.ep=8",
                    "--set", "parallel.global_batch_size=72")
    assert whole.returncode == 0 and whole.stderr == ""


# --- NCCL's PAT: all-gather and reduce-scatter with one rank per node ------------------------------------------

def gpu_group(size: int, nodes: int):
    from mpsim.cost.links import LinkCost
    from mpsim.cost.nccl import GpuGroup
    # no measured curve, so only NCCL's own latency and bandwidth terms are left
    return GpuGroup(size=size, nodes=nodes, per_node=size // nodes, intra=LinkCost(450e9, 3.4e-6),
                    inter=LinkCost(50e9, 14e-6), base_latency_s=8.4e-6)


def test_pat_latency_is_nccls_tuner_formula():
    from mpsim.cost.nccl import pat
    # tuning.cc: 8 us base + log2(nodes) * 14 us / 3.5 + nRanks * 2.8 us; one byte adds almost nothing
    expected = 8e-6 + 10 * 14e-6 / 3.5 + 1024 * 2.8e-6
    assert pat("reduce-scatter", 1.0, gpu_group(1024, 1024)) == pytest.approx(expected, rel=1e-6)
    # a quarter less bus bandwidth than the ring's: the bytes take 4/3 as long
    big = 1e12
    assert pat("all-gather", big, gpu_group(1024, 1024)) - expected == pytest.approx(
        1023 / 1024 * big / (0.75 * 50e9), rel=1e-6)


def test_pat_is_offered_only_for_gathers_and_scatters_with_one_rank_per_node():
    from mpsim.cost.nccl import candidates
    names = lambda kind, size, nodes: {e.algorithm for e in candidates(kind, 1e6, gpu_group(size, nodes))}  # noqa: E731
    assert "pat" in names("reduce-scatter", 64, 64) and "pat" in names("all-gather", 64, 64)
    assert "pat" not in names("all-reduce", 64, 64)
    assert "pat" not in names("reduce-scatter", 64, 8)  # 8 ranks per node
    assert "pat" not in names("reduce-scatter", 8, 1)


def test_pat_wins_small_messages_over_many_nodes_and_the_ring_large_ones_over_few():
    from mpsim.cost.nccl import candidates
    def best(size_bytes: float, nodes: int) -> str:
        return min(candidates("reduce-scatter", size_bytes, gpu_group(nodes, nodes)), key=lambda e: e.time_s).algorithm
    assert best(1 << 20, 1024) == "pat"  # 1 MiB over 1,024 nodes: the ring pays 1,023 network steps
    assert best(1 << 30, 16) == "ring"  # 1 GiB over 16 nodes: PAT's lower bandwidth costs more
    # more nodes only make PAT's case stronger
    pat_wins = [best(1 << 24, n) == "pat" for n in (16, 64, 256, 1024)]
    assert pat_wins == sorted(pat_wins)


# --- NVLS-tree: the network part rides on the node's NVLS heads ------------------------------------------------

def test_nvls_tree_crosses_the_network_through_at_most_32_heads_a_node():
    from mpsim.cost.links import LinkCost
    from mpsim.cost.nccl import NVLS_MAX_HEADS, GpuGroup, nvls_tree_all_reduce

    def group(per_node: int) -> GpuGroup:
        # a slow network, so that its part sets the pace
        return GpuGroup(size=4 * per_node, nodes=4, per_node=per_node, intra=LinkCost(900e9, 3.4e-6),
                        inter=LinkCost(5e9, 14e-6), base_latency_s=8.4e-6, in_switch=LinkCost(900e9, 3.4e-6),
                        in_switch_min_ranks=2)
    size = 1e10
    network_s = lambda g: nvls_tree_all_reduce(size, group(g))  # noqa: E731
    # an 8-GPU node: every GPU is a head and its NIC carries 2 S / 8 (NCCL's double binary tree)
    assert network_s(8) == pytest.approx(2 * size / 8 / 5e9, rel=1e-3)
    # a 72-GPU NVL72 domain has 32 heads, not 72: each of their NICs carries 2 S / 32
    assert NVLS_MAX_HEADS == 32
    assert network_s(72) == pytest.approx(2 * size / 32 / 5e9, rel=1e-3)
    assert network_s(32) == pytest.approx(network_s(72), rel=1e-3)
