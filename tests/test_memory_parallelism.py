"""Memory model and the wider parallelism space: ZeRO/FSDP, CP, EP/MoE, HF configs."""

from __future__ import annotations

import pickle

import pytest

from mpsim.cli import main
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.results.memory import rank_memory
from mpsim.simulate import plan_schedule, simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.blocks import LayerContext
from mpsim.workload.memory import layer_activation_bytes
from tests.conftest import SCENARIOS

LLAMA8 = SCENARIOS / "llama3_70b_32xh100.yaml"


def run(path, *overrides):
    result = simulate(load_scenario(path, list(overrides)).scenario)
    return result, summarize(result)


# --- activation memory against Korthikanti et al. 2022, Sec. 4 ------------------------------------------------
# The paper counts, per transformer layer, the tensors kept for the backward pass of a GPT
# layer (GeLU MLP of 4h, full multi-head attention, dropout, 16-bit activations, 1-byte
# dropout masks). The inventory below is written out tensor by tensor from Sec. 4.1 and split
# over tensor parallelism as in Sec. 4.2; it is the paper's derivation, not mpsim's code.


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str) -> float:
    """Bytes one GPT layer keeps per microbatch on one of ``t`` tensor-parallel ranks."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)  # only the layer's input
    sbh, as2b = s * b * h, a * s * s * b
    # split over TP: the heads' Q and K (4sbh), V (2sbh), the output projection's input (2sbh),
    # the GeLU's input and output (8sbh + 8sbh)
    split = 4 * sbh + 2 * sbh + 2 * sbh + 8 * sbh + 8 * sbh
    # the attention core, split over heads: softmax output (2as^2b), its dropout mask
    # (as^2b), the dropout output (2as^2b); selective recompute drops all three
    core = 0 if recompute == "selective" else 2 * as2b + as2b + 2 * as2b
    # replicated across TP unless sequence parallel: two layernorm inputs (2 x 2sbh), the
    # QKV and FC1 inputs (2 x 2sbh), two dropout masks (2 x sbh)
    replicated = 2 * 2 * sbh + 2 * 2 * sbh + 2 * sbh
    return (split + core) / t + replicated / (t if sp else 1)


def test_korthikantis_inventory_gives_the_papers_closed_forms():
    # a check of the inventory above against the paper's Table 2 (s=2048, h=6144, a=64, t=8)
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    sbh = s * b * h
    table_2 = {(1, False, "none"): sbh * (34 + 5 * a * s / h),
               (t, False, "none"): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
               (t, True, "none"): sbh / t * (34 + 5 * a * s / h),
               (t, False, "selective"): sbh * (10 + 24 / t),
               (t, True, "selective"): 34 * sbh / t}
    for (tp, sp, recompute), closed_form in table_2.items():
        assert korthikanti_layer_bytes(s, b, h, a, tp, sp, recompute) == pytest.approx(closed_form, rel=1e-12)


def gpt_layer(s: int, b: int, h: int, a: int, t: int, sp: bool) -> LayerContext:
    """One GPT layer of Megatron-LM 2022: GeLU MLP of 4h, MHA, dropout, unfused attention, bf16."""
    return LayerContext(microbatch_size=b, seq_length=s, hidden=h, heads=a, kv_heads=a, head_dim=h // a,
                        ffn_hidden=4 * h, gated_ffn=False, tp=t, sequence_parallel=sp, flash_attention=False,
                        dropout=True, rope=False)


@pytest.mark.parametrize("s,b,h,a", [(2048, 4, 6144, 64), (2048, 1, 12288, 96), (2048, 1, 25600, 160)],
                         ids=["22B", "175B", "1T"])
@pytest.mark.parametrize("t,sp", [(1, False), (8, False), (8, True)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpt_layer_activations_are_korthikantis_tensors(s, b, h, a, t, sp, recompute):
    ours = layer_activation_bytes(gpt_layer(s, b, h, a, t, sp), recompute)
    assert ours == pytest.approx(korthikanti_layer_bytes(s, b, h, a, t, sp, recompute), rel=1e-12)


def first_rank_memory(path, *overrides: str):
    """Memory of pipeline rank 0, its activations from the schedule it runs."""
    scenario = load_scenario(path, list(overrides)).scenario
    layout = resolve(scenario)
    return rank_memory(scenario, layout, plan_schedule(scenario, layout), build_workload(scenario, layout))[0]


def first_stage_layer_activations(path, *overrides: str) -> float:
    return first_rank_memory(path, *overrides).layer_activations_peak_bytes


@pytest.mark.parametrize("name,layers,h", [("megatron_1t_512xa100.yaml", 2, 25600),  # 2 of 128 layers
                                           ("gpt3_175b_64xa100.yaml", 3 * 4, 12288)])  # 3 chunks of 4
def test_first_stage_layer_state_is_18_bytes_per_parameter(name, layers, h):
    # A GPT layer split over t = 8: the 12h^2 weights and the QKV and FC1 biases (3h + 4h) are
    # split, the two row-parallel output biases (2h) and the two layernorms (4h) replicated.
    # Mixed-precision Adam without ZeRO keeps 18 bytes per parameter: bf16 weight, fp32
    # gradient, fp32 master weight, momentum and variance (Korthikanti et al. 2022, Sec. 4).
    t = 8
    params_per_layer = 12 * h * h / t + 7 * h / t + 6 * h
    assert first_rank_memory(SCENARIOS / name).layer_state_bytes == pytest.approx(
        18 * layers * params_per_layer, rel=1e-12)


def test_first_1f1b_stage_holds_p_microbatches_of_its_layers():
    # Megatron 1T, Table 3: 128 layers on 64 stages of 2, 1F1B, SP + selective recompute.
    # 1F1B's first stage runs p forwards before its first backward: 64 x 2 = 128 layers in flight.
    per_layer = 34 * 2048 * 1 * 25600 / 8
    assert first_stage_layer_activations(SCENARIOS / "megatron_1t_512xa100.yaml") == pytest.approx(
        128 * per_layer, rel=1e-12)


def test_first_interleaved_stage_holds_megatrons_warm_up_plus_one():
    # GPT-3 175B, Table 3: 96 layers, p=8 ranks of v=3 chunks of 4 layers, 64 microbatches.
    # Megatron's interleaved schedule warms up rank 0 with 2 (p - 1) + (v - 1) p = 30 chunk
    # forwards, then runs one more before the first backward: 31 chunks x 4 layers = 124 layers,
    # 96 (1 + (p - 1) / (p v)) as Korthikanti's Figure 1 counts for this model.
    per_layer = 34 * 2048 * 1 * 12288 / 8
    assert first_stage_layer_activations(SCENARIOS / "gpt3_175b_64xa100.yaml") == pytest.approx(
        (2 * 7 + 2 * 8 + 1) * 4 * per_layer, rel=1e-12)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_shards_state_as_one_over_n(stage):
    states = {}
    for dp in (2, 4, 8):
        _, summary = run(LLAMA8, "model=llama3-8b", "parallel.tp=1", "parallel.pp=1", "parallel.sequence_parallel=false",
                         "cluster.nodes=null", f"cluster.num_devices={dp}", f"parallel.zero_stage={stage}",
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
    # FSDP keeps each rank's shard in fp32 (twice the bf16 weights' bytes), the optimizer's master
    assert fsdp.memory[0].weights_bytes == pytest.approx(2 * plain.memory[0].weights_bytes / 16)
    assert hybrid.memory[0].weights_bytes == pytest.approx(2 * plain.memory[0].weights_bytes / 8)
    _, deepspeed = run(LLAMA8, *base, "parallel.zero_stage=3", "parallel.zero_impl=deepspeed")
    assert deepspeed.memory[0].weights_bytes == pytest.approx(plain.memory[0].weights_bytes / 16)


def test_fsdps_fp32_shard_is_the_master_weight_deepspeed_keeps_a_bf16_partition_too():
    """Per parameter sharded over 16 ranks, with Adam: FSDP 4 (fp32 shard) + 4 (fp32 gradient) + 8
    (m and v) bytes over 16; DeepSpeed's ZeRO-3 2 more (its bf16 partition beside the master)."""
    base = ["model=llama3-8b", "parallel.tp=1", "parallel.pp=1", "parallel.sequence_parallel=false",
            "cluster.nodes=2", "parallel.global_batch_size=16", "parallel.zero_stage=3"]
    states = {}
    for impl in ("fsdp", "deepspeed"):
        result, summary = run(LLAMA8, *base, f"parallel.zero_impl={impl}")
        rank = summary.memory[0]
        params = result.workload.stages[0].params
        states[impl] = (rank.weights_bytes + rank.grads_bytes + rank.optimizer_bytes) / params
    assert states["fsdp"] == pytest.approx(16 / 16)
    assert states["deepspeed"] == pytest.approx(18 / 16)


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


def test_a_rank_that_fits_only_without_fragmentation_gets_a_note():
    from dataclasses import replace

    from mpsim.results import format_summary

    _, summary = run(LLAMA8)
    fullest = max(summary.memory, key=lambda m: m.peak_memory_bytes)
    assert "leaves" not in format_summary(summary)  # 70B on 32 H100 leaves a few GiB free per device

    def on_devices(capacity, fragmentation_bytes=0.0):
        memory = [replace(m, capacity_bytes=capacity, fragmentation_bytes=fragmentation_bytes)
                  for m in summary.memory]
        peak = max(m.peak_memory_bytes for m in memory)
        return format_summary(replace(summary, memory=memory, peak_memory_bytes=peak, capacity_bytes=capacity))

    # 3 % free fits, but less than the least fragmentation a published run showed (6.6 %)
    text = on_devices(fullest.peak_memory_bytes * 1.03)
    assert f"note: rank {fullest.rank} leaves" in text and "training.memory_fragmentation" in text
    assert "leaves" not in on_devices(fullest.peak_memory_bytes * 1.07)
    # with fragmentation modelled the peak already holds it: no note
    assert "leaves" not in on_devices(fullest.peak_memory_bytes * 1.03 + 1e9, fragmentation_bytes=1e9)
    # out of memory is a warning of its own
    assert "leaves" not in on_devices(fullest.peak_memory_bytes * 0.9)
