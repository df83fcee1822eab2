"""Memory model and the wider parallelism space: ZeRO/FSDP, CP, EP/MoE, HF configs."""

from __future__ import annotations

import importlib.util
import pickle

import pytest

from mpsim.cli import main
from mpsim.results import summarize
from mpsim.results.memory import rank_memory
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import ROOT, SCENARIOS

LLAMA8 = SCENARIOS / "llama3_70b_32xh100.yaml"


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(path, *overrides):
    result = simulate(load_scenario(path, list(overrides)).scenario)
    return result, summarize(result)


def test_korthikanti_figure_1_within_3_percent():
    rows = _load(ROOT / "benchmarks" / "memory_korthikanti.py").compare()
    assert len(rows) == 12
    for model, quantity, figure, ours in rows:
        assert ours == pytest.approx(figure, rel=0.03), (model, quantity)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_shards_state_as_one_over_n(stage):
    states = {}
    for dp in (2, 4, 8):
        _, summary = run(LLAMA8, "model=llama3-8b", "parallel.tp=1", "parallel.pp=1", "parallel.sequence_parallel=false",
                         f"cluster.nodes=null", f"cluster.num_devices={dp}", f"parallel.zero_stage={stage}",
                         "parallel.global_batch_size=8")
        m = summary.memory[0]
        sharded = {1: m.optimizer_bytes, 2: m.optimizer_bytes + m.grads_bytes,
                   3: m.optimizer_bytes + m.grads_bytes + m.weights_bytes}[stage]
        states[dp] = sharded * dp
    assert states[2] == pytest.approx(states[4], rel=1e-9) == pytest.approx(states[8], rel=1e-9)


def test_fsdp_traffic_repeats_per_microbatch_and_shows_on_a_slow_network():
    base = ["model=llama3-8b", "parallel.tp=1", "parallel.pp=1", "parallel.sequence_parallel=false",
            "cluster.nodes=2"]

    def dp_syncs(*extra):
        result, summary = run(LLAMA8, *base, *extra)
        return len([s for s in result.timeline.syncs if s.kind == "dp-comm"]), summary

    plain_1, _ = dp_syncs("parallel.global_batch_size=16")
    plain_4, _ = dp_syncs("parallel.global_batch_size=64")
    fsdp_1, fast = dp_syncs("parallel.global_batch_size=16", "parallel.zero_stage=3")
    fsdp_4, _ = dp_syncs("parallel.global_batch_size=64", "parallel.zero_stage=3")
    assert plain_4 == plain_1  # one all-reduce per step
    assert fsdp_4 == 4 * fsdp_1  # gradients scattered after every microbatch's backward
    _, slow = dp_syncs("parallel.global_batch_size=16", "parallel.zero_stage=3",
                       "cluster.system.scale_out.nic_bandwidth=10 Gb/s")
    assert slow.exposed_dp_comm_s > fast.exposed_dp_comm_s
    assert slow.ranks[0].zero_gather_exposed_s > 0  # parameter gathers no longer hide under compute


def test_hybrid_shard_keeps_a_larger_shard():
    base = ["model=llama3-8b", "parallel.tp=1", "parallel.pp=1", "parallel.sequence_parallel=false",
            "cluster.nodes=2", "parallel.global_batch_size=16"]
    _, plain = run(LLAMA8, *base)
    _, fsdp = run(LLAMA8, *base, "parallel.zero_stage=3")
    _, hybrid = run(LLAMA8, *base, "parallel.zero_stage=3", "parallel.zero_shard_size=8")
    assert fsdp.memory[0].weights_bytes == pytest.approx(plain.memory[0].weights_bytes / 16)
    assert hybrid.memory[0].weights_bytes == pytest.approx(plain.memory[0].weights_bytes / 8)


def test_context_parallelism_divides_activations():
    activations = {}
    for cp in (1, 2, 4):
        result, _ = run(LLAMA8, f"parallel.cp={cp}", f"cluster.nodes={4 * cp}")
        activations[cp] = result.workload.stages[1].layer_activation_bytes
    assert activations[2] == pytest.approx(activations[1] / 2, rel=1e-6)
    assert activations[4] == pytest.approx(activations[1] / 4, rel=1e-6)


@pytest.mark.parametrize("mode", ["ring", "all-gather", "all-to-all"])
def test_context_parallel_modes_simulate_and_show_cp_traffic(mode):
    _, summary = run(LLAMA8, "parallel.cp=2", "cluster.nodes=8", f"parallel.cp_comm={mode}",
                     "model.seq_length=32768")
    assert summary.step_time_s > 0
    if mode != "ring":
        assert summary.exposed_cp_comm_s > 0  # not hidden under attention


def test_expert_parameters_divide_by_ep():
    experts = {}
    for ep in (1, 2, 8):
        result, _ = run(SCENARIOS / "mixtral_8x7b_64xh100.yaml", f"parallel.ep={ep}")
        experts[ep] = result.workload.stages[0].expert_params
    assert experts[2] == pytest.approx(experts[1] / 2)
    assert experts[8] == pytest.approx(experts[1] / 8)


def test_moe_load_imbalance_slows_the_step():
    path = SCENARIOS / "mixtral_8x7b_64xh100.yaml"
    _, even = run(path)
    _, skewed = run(path, "model.moe.load_imbalance=1.5")
    _, capped = run(path, "model.moe.load_imbalance=1.5", "model.moe.capacity_factor=1.1")
    assert even.exposed_ep_comm_s > 0
    assert skewed.step_time_s > capped.step_time_s > even.step_time_s


def test_llama3_405b_long_context_fits_only_with_context_parallelism():
    path = SCENARIOS / "llama3_405b_128k_16384xh100.yaml"
    _, with_cp = run(path)
    assert not with_cp.out_of_memory
    _, without = run(path, "parallel.cp=1", "cluster.nodes=128")  # same TP/PP/DP, no CP
    assert without.out_of_memory
    assert without.memory[0].largest_category == "activations"


def test_recompute_trades_memory_for_time():
    summaries = {mode: run(LLAMA8, f"parallel.recompute={mode}")[1] for mode in ("none", "selective", "full")}
    memory = {mode: s.memory[0].activations_peak_bytes for mode, s in summaries.items()}
    assert memory["full"] < memory["selective"] < memory["none"]
    assert summaries["full"].step_time_s > summaries["none"].step_time_s
    assert summaries["full"].hfu > summaries["full"].mfu  # recompute counts in hardware FLOPs only


def test_hugging_face_config_gives_the_shipped_model():
    from_hf = load_scenario(LLAMA8, ["model=hf:models/hf/llama3_8b_config.json"]).scenario.model
    shipped = load_scenario(LLAMA8, ["model=llama3-8b"]).scenario.model
    fields = set(type(shipped).model_fields) - {"name", "description"}
    assert {f: getattr(from_hf, f) for f in fields} == {f: getattr(shipped, f) for f in fields}


def test_model_reference_with_overrides():
    model = load_scenario(LLAMA8, ["model={base: llama3-8b, seq_length: 4096}"]).scenario.model
    assert model.seq_length == 4096 and model.hidden_size == 4096


def test_memory_snapshot_opens_as_a_pytorch_snapshot(tmp_path, capsys):
    path = tmp_path / "snapshot.pickle"
    assert main(["run", str(LLAMA8), "--memory-snapshot", str(path), "--memory-plot", str(tmp_path / "m.png")]) == 0
    snapshot = pickle.loads(path.read_bytes())
    events = snapshot["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    frees = [e for e in events if e["action"] == "free_completed"]
    assert allocs and len(allocs) == len(frees)  # every activation freed by the end of the step
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
    viz = pytest.importorskip("torch.cuda._memory_viz")
    assert "<" in viz.trace_plot(snapshot)


@pytest.mark.parametrize("overrides,fragment", [
    (["parallel.ep=2"], "needs a mixture-of-experts model"),
    (["parallel.cp=2", "cluster.nodes=8", "training.attention=unfused"], "fused attention"),
    (["model=mixtral-8x7b", "parallel.sequence_parallel=false", "parallel.pp=1", "cluster.nodes=1"],
     "route sequence-parallel"),
    (["parallel.zero_shard_size=3", "cluster.nodes=8"], "does not divide dp"),
])
def test_bad_parallel_layouts(overrides, fragment, capsys):
    assert main(["run", str(LLAMA8), *[arg for o in overrides for arg in ("--set", o)]]) == 2
    assert fragment in capsys.readouterr().err
