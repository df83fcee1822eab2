"""Framework behaviours that hide or add time and memory: DualPipe's paired passes, the distributed
optimizer over DP x CP, FSDP's resharding and hybrid sharding, Megatron's uneven end stages,
the memory a process reserves, the parameter all-gather overlapped with the forward and
Megatron-Core's gradient buckets."""

from __future__ import annotations

import pytest

from mpsim.cli import main
from mpsim.cost.actions import ActionCost, CostModel
from mpsim.cost.pairs import overlapped_cost
from mpsim.cost.step import (GRAD_ZERO_BYTES_PER_PARAM, bucket_params, bucket_sizes, final_grad_buckets,
                             optimizer_update_s, param_gather_exposed_s, param_gather_s)
from mpsim.errors import InputError
from mpsim.explore.planbase import apply_fields, base_scenario
from mpsim.explore.planner import plan
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.results.memory import rank_memory
from mpsim.schedules.actions import Overlapped
from mpsim.simulate import optimizer_steps, plan_schedule, schedule_costs, simulate
from mpsim.specs import load_scenario
from mpsim.specs.layout import resolve_layout
from mpsim.workload import build_workload
from mpsim.workload.memory import NCCL_CONNECTION_BYTES, reserved_bytes, reserved_parts
from tests.conftest import SCENARIOS, TINY_MODEL

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"
LLAMA8 = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"


def scenario(path, *overrides: str):
    return load_scenario(path, list(overrides)).scenario


def prepared(path, *overrides: str):
    """(scenario, layout, workload, cost model) of a shipped scenario with overrides."""
    s = scenario(path, *overrides)
    layout = resolve(s)
    return s, layout, build_workload(s, layout), CostModel(s, layout)


# --- DualPipe / DualPipeV: the paired forward and backward -----------------------------------------------------

DUALPIPEV = ("parallel.schedule=dualpipev", "parallel.vpp=2")


def pair_costs(*overrides: str) -> list[tuple[ActionCost, ActionCost, ActionCost]]:
    """(forward, backward, pair) costs of every forward+backward pair of a DualPipeV Llama 3 70B step."""
    s, layout, workload, model = prepared(LLAMA70, *DUALPIPEV, *overrides)
    schedule = plan_schedule(s, layout)
    costs = schedule_costs(schedule, workload, model)
    pairs = {(item.forward.stage, item.backward.stage, item.backward.kind)
             for rank in schedule.actions for item in rank if isinstance(item, Overlapped)}
    assert pairs, "DualPipeV pairs forwards with backwards"
    return [(costs[(f, "F")], costs[(b, kind)], costs[(f, "F", b, kind)]) for f, b, kind in sorted(pairs)]


def test_paired_passes_run_back_to_back_unless_the_framework_overlaps_them():
    assert scenario(LLAMA70).training.overlap_paired_passes is False  # PyTorch's ScheduleDualPipeV
    hidden = 0.0
    for forward, backward, pair in pair_costs():
        exposed = forward.tp_exposed_s + backward.tp_exposed_s
        assert pair.duration_s >= forward.compute_s + backward.compute_s + exposed - 1e-12
        assert pair.duration_s == pytest.approx(forward.duration_s + backward.duration_s, rel=1e-12)
        assert pair.tp_exposed_s == pytest.approx(exposed, rel=1e-12)
    for (forward, backward, off), (_, _, on) in zip(pair_costs(), pair_costs("training.overlap_paired_passes=true")):
        assert on.duration_s <= off.duration_s + 1e-15  # overlapping can only hide time
        hidden += off.duration_s - on.duration_s
    assert hidden > 0  # TP 8 leaves communication exposed that the other pass's compute hides


def test_overlapped_cost_hides_only_what_the_other_pass_computes():
    forward = ActionCost(3.0, 2.0, 1.5, 1.0, 0.0, ())
    backward = ActionCost(5.0, 4.0, 1.0, 1.0, 0.0, ())
    assert overlapped_cost(forward, backward, overlap=False).duration_s == 8.0
    assert overlapped_cost(forward, backward, overlap=True).duration_s == 6.0  # 2 s exposed under 6 s of compute
    heavy = ActionCost(9.0, 1.0, 8.0, 8.0, 0.0, ())
    assert overlapped_cost(heavy, backward, overlap=True).duration_s == pytest.approx(5.0 + 9.0 - 5.0)


def test_dualpipev_step_is_longer_without_the_overlap():
    off = simulate(scenario(LLAMA70, *DUALPIPEV)).timeline.step_time_s
    on = simulate(scenario(LLAMA70, *DUALPIPEV, "training.overlap_paired_passes=true")).timeline.step_time_s
    assert on < off


PLAN = dict(top=3, max_microbatch_size=1, max_vpp=2, schedules=("1f1b", "dualpipev"), zero_stages=(0,),
            workers=1, progress=False)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "gpt_1_3b.yaml"
    path.write_text(TINY_MODEL)
    return str(path)


def test_planner_prices_dualpipev_pairs_without_an_overlap_nobody_asked_for(tiny):
    base = base_scenario(tiny, "dgx-a100", 8, 16)
    result = plan(base, **PLAN)
    dualpipev = [(point, record) for point, record in zip(result.points, result.records)
                 if record and record["status"] == "ok" and dict(point)["parallel.schedule"] == "dualpipev"]
    assert dualpipev, "the planner simulates DualPipeV layouts"
    for point, record in dualpipev:
        s = apply_fields(base, dict(point))
        # the planner's step is the plain simulation's, which runs the pairs back to back
        assert record["metrics"]["step_time_s"] == pytest.approx(simulate(s).timeline.step_time_s, rel=1e-9)
        layout = resolve(s)
        costs = schedule_costs(plan_schedule(s, layout), build_workload(s, layout), CostModel(s, layout))
        for key, cost in costs.items():
            if len(key) == 4:
                forward, backward = costs[key[:2]], costs[key[2:]]
                assert cost.duration_s >= (forward.compute_s + backward.compute_s + forward.tp_exposed_s
                                           + backward.tp_exposed_s) * (1 - 1e-12)
    # asking for the overlap can only make DualPipeV layouts faster
    overlapped = plan(base_scenario(tiny, "dgx-a100", 8, 16, overrides=["training.overlap_paired_passes=true"]),
                      **PLAN)
    by_layout = {point: record for point, record in zip(overlapped.points, overlapped.records)}
    for point, record in dualpipev:
        again = by_layout.get(point)
        if again and again["status"] == "ok":
            assert again["metrics"]["step_time_s"] <= record["metrics"]["step_time_s"] * (1 + 1e-9)


# --- the distributed optimizer shards over DP x CP ---------------------------------------------------------------

CP_BASE = ("parallel.tp=8", "parallel.pp=1", "parallel.dp=2", "parallel.global_batch_size=16",
           "parallel.zero_stage=1")


def test_distributed_optimizer_shards_over_data_and_context_parallel_ranks():
    states, updates, groups = {}, {}, {}
    for cp in (1, 2):
        s, layout, workload, model = prepared(LLAMA8, *CP_BASE, f"parallel.cp={cp}", f"cluster.nodes={2 * cp}")
        assert layout.shard_ranks == 2 * cp
        memory = rank_memory(s, layout, plan_schedule(s, layout), workload)[0]
        states[cp] = memory.optimizer_bytes
        # the update of the rank's shard, without zeroing its full local gradient buffer (not sharded)
        zeroing = sum(w.params for w in workload.stages) * GRAD_ZERO_BYTES_PER_PARAM / model.compute.memory_bandwidth
        updates[cp] = optimizer_update_s(list(workload.stages), model) - zeroing
        groups[cp] = model.placements["zero"].size
    assert states[2] == pytest.approx(states[1] / 2, rel=1e-12)  # Adam's state per rank halves
    assert updates[2] == pytest.approx(updates[1] / 2, rel=1e-12)  # so does the memory-bound update
    assert groups == {1: 2, 2: 4}  # and the reduce-scatter / all-gather run over the same DP x CP ranks


def test_grad_reduce_scatter_moves_each_ranks_shard_of_the_dp_cp_group():
    s, layout, workload, model = prepared(LLAMA8, *CP_BASE, "parallel.cp=2", "cluster.nodes=4")
    buckets = final_grad_buckets(workload.stages[0], model)
    assert buckets and all(bucket[3] == "zero" for bucket in buckets)
    assert all("reduce-scatter" in bucket[2] for bucket in buckets)


# --- FSDP: reshard after forward, hybrid sharding ---------------------------------------------------------------

FSDP = ("parallel.tp=1", "parallel.pp=1", "parallel.dp=16", "parallel.sequence_parallel=false", "cluster.nodes=2",
        "parallel.global_batch_size=32", "parallel.zero_stage=3", "parallel.recompute=full")


def gathers(passes) -> list[str]:
    return [block.gather.name for block in passes if block.gather is not None]


def test_without_reshard_after_forward_the_backward_gathers_nothing():
    _, _, resharded, _ = prepared(LLAMA8, *FSDP)
    _, layout, kept, _ = prepared(LLAMA8, *FSDP, "parallel.reshard_after_forward=false")
    assert not layout.reshard_after_forward
    for work in (resharded.stages[0], kept.stages[0]):
        assert len(gathers(work.forward)) == work.layers + 2  # every layer, the embedding and the head
    assert len(gathers(resharded.stages[0].backward)) == resharded.stages[0].layers + 2
    for passes in (kept.stages[0].backward, kept.stages[0].backward_input, kept.stages[0].backward_weight):
        assert gathers(passes) == []
    on = summarize(simulate(scenario(LLAMA8, *FSDP)))
    off = summarize(simulate(scenario(LLAMA8, *FSDP, "parallel.reshard_after_forward=false")))
    assert off.step_time_s < on.step_time_s  # one all-gather per layer and microbatch less


def test_keeping_the_last_layer_gathered_saves_its_backward_gather_only():
    # torchtitan: fully_shard(block, reshard_after_forward=int(layer_id) < len(model.layers) - 1)
    _, _, resharded, _ = prepared(LLAMA8, *FSDP)
    _, layout, kept, _ = prepared(LLAMA8, *FSDP, "parallel.reshard_last_layer=false")
    assert not layout.reshard_last_layer and layout.reshard_after_forward
    work, every = kept.stages[0], resharded.stages[0]
    last = f"layer {work.layers - 1}"
    assert gathers(work.forward) == gathers(every.forward)  # the forward gathers every unit as before
    for passes in (work.backward, work.backward_input):
        assert [block.label for block in passes if block.gather is not None] == \
            [block.label for block in every.backward if block.gather is not None and block.label != last]
    on = summarize(simulate(scenario(LLAMA8, *FSDP)))
    off = summarize(simulate(scenario(LLAMA8, *FSDP, "parallel.reshard_last_layer=false")))
    assert off.step_time_s < on.step_time_s  # one layer's all-gather per microbatch less
    # without resharding at all the setting changes nothing
    held = summarize(simulate(scenario(LLAMA8, *FSDP, "parallel.reshard_after_forward=false")))
    both = summarize(simulate(scenario(LLAMA8, *FSDP, "parallel.reshard_after_forward=false",
                                       "parallel.reshard_last_layer=false")))
    assert both.step_time_s == held.step_time_s
    # a layer-stack model (ViT-H/14): the same one gather less, on the stage that holds the loss
    vit = (SCENARIOS / "vit_h14_32xa100.yaml", "parallel.zero_stage=3")
    _, _, stack_every, _ = prepared(*vit)
    _, _, stack_kept, _ = prepared(*vit, "parallel.reshard_last_layer=false")
    assert len(gathers(stack_kept.stages[0].backward)) == len(gathers(stack_every.stages[0].backward)) - 1
    assert summarize(simulate(scenario(*vit, "parallel.reshard_last_layer=false"))).step_time_s < \
        summarize(simulate(scenario(*vit))).step_time_s


def test_without_reshard_after_forward_the_peak_holds_the_unsharded_parameters():
    def memory(*extra):
        s, layout, workload, _ = prepared(LLAMA8, *FSDP, *extra)
        return rank_memory(s, layout, plan_schedule(s, layout), workload)[0], workload.stages[0]

    on, _ = memory()
    off, work = memory("parallel.reshard_after_forward=false")
    unsharded = (work.params + work.expert_params) * 2  # bf16 weights of every layer in flight
    assert on.gathered_params_bytes == 0
    assert off.gathered_params_bytes == pytest.approx(unsharded, rel=1e-12)
    assert off.buffers_bytes >= unsharded
    assert off.activations_peak_bytes == pytest.approx(on.activations_peak_bytes, rel=1e-12)
    assert off.peak_memory_bytes > on.peak_memory_bytes + 0.9 * unsharded


def test_hybrid_shard_gathers_within_the_shard_group_and_all_reduces_across_replicas():
    _, layout, workload, model = prepared(LLAMA8, *FSDP, "cluster.nodes=4", "parallel.dp=32",
                                          "parallel.zero_shard_size=8")
    assert (layout.dp, layout.zero_shard_size) == (32, 8)
    gather_groups = {block.gather.group for block in workload.stages[0].forward if block.gather is not None}
    assert gather_groups == {"zero"} and model.placements["zero"].size == 8
    assert model.placements["zero"].nodes == 1  # one node's eight GPUs
    replicas = [b for b in final_grad_buckets(workload.stages[0], model) if b[3] == "zero-replica"]
    assert replicas and all("across replicas" in b[2] for b in replicas)
    assert model.placements["zero-replica"].size == 4


# --- Megatron's embedding / loss counted as layers ---------------------------------------------------------------

@pytest.mark.parametrize("pp,vpp,embedding,loss,expected", [
    (2, 1, True, True, (16, 16)),  # 32 + 2 = 34 -> 17 per rank, one less at each end
    (3, 1, True, False, (10, 11, 11)),  # 33 -> 11 per rank
    (3, 1, False, True, (11, 11, 10)),
    (2, 1, True, False, None),  # 33 does not split over 2 ranks
    (2, 3, True, True, None),  # 34 / 2 = 17 does not split over 3 chunks
    (3, 1, True, True, None),  # 34 does not split over 3 ranks
    (2, 5, True, True, None),
    (4, 2, False, True, None),  # 33 does not split over 4 ranks
])
def test_embedding_and_loss_count_as_layers_like_megatron(pp, vpp, embedding, loss, expected):
    s = scenario(LLAMA8, f"parallel.pp={pp}", f"parallel.vpp={vpp}", "parallel.dp=1", f"cluster.nodes={pp}",
                 "parallel.global_batch_size=16", "parallel.schedule=" + ("interleaved-1f1b" if vpp > 1 else "1f1b"),
                 f"parallel.account_for_embedding_in_pipeline_split={str(embedding).lower()}",
                 f"parallel.account_for_loss_in_pipeline_split={str(loss).lower()}")
    if expected is None:
        with pytest.raises(InputError) as error:
            resolve_layout(s)
        assert error.value.field.startswith("parallel.account_for_")
        return
    assert resolve_layout(s).layers_per_chunk == expected


def test_embedding_in_the_split_with_interleaving():
    # 32 + 2 = 34 layers do not split over 4 ranks; 30 + 2 = 32 do: 8 per rank, 4 per chunk
    s = scenario(LLAMA8, "model.num_layers=30", "parallel.pp=4", "parallel.vpp=2", "parallel.dp=1", "cluster.nodes=4",
                 "parallel.global_batch_size=16", "parallel.schedule=interleaved-1f1b",
                 "parallel.account_for_embedding_in_pipeline_split=true",
                 "parallel.account_for_loss_in_pipeline_split=true")
    assert resolve_layout(s).layers_per_chunk == (3, 4, 4, 4, 4, 4, 4, 3)


def test_embedding_in_the_split_lightens_the_first_stage():
    moved = summarize(simulate(scenario(LLAMA70, "model.num_layers=79",
                                        "parallel.account_for_embedding_in_pipeline_split=true")))
    assert moved.layers_per_stage == (19, 20, 20, 20)
    assert moved.memory[0].activations_peak_bytes < summarize(
        simulate(scenario(LLAMA70, "model.num_layers=79", "parallel.layers_per_stage=[20,20,20,19]"))
    ).memory[0].activations_peak_bytes


def test_embedding_in_the_split_refuses_an_explicit_list(capsys):
    code = main(["run", str(LLAMA70), "--set", "parallel.layers_per_stage=[20,20,20,20]",
                 "--set", "parallel.account_for_loss_in_pipeline_split=true"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "parallel.account_for_loss_in_pipeline_split" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("path,sets", [
    (LLAMA70, ("parallel.layers_per_stage=auto",)),
    (SCENARIOS / "wav2vec2_large_16xa100.yaml", ()),  # a layer stack: its embedding and loss are units already
])
def test_embedding_in_the_split_needs_the_even_split_of_a_transformer(path, sets):
    s = scenario(path, *sets, "parallel.account_for_embedding_in_pipeline_split=true")
    with pytest.raises(InputError) as error:
        resolve_layout(s)
    assert error.value.field == "parallel.account_for_embedding_in_pipeline_split"


# --- memory a process holds besides its tensors -------------------------------------------------------------------

def test_reserved_memory_is_a_sum_of_named_parts():
    s, layout, workload, _ = prepared(LLAMA70)
    parts = dict(reserved_parts(s, layout))
    assert set(parts) >= {"CUDA context", "cuBLAS workspace"}
    nccl = [size for name, size in parts.items() if name.startswith("NCCL buffers")]
    # TP and pipeline communicators, 16 channels each on DGX H100
    assert nccl == [2 * 16 * NCCL_CONNECTION_BYTES]
    memory = rank_memory(s, layout, plan_schedule(s, layout), workload)[0]
    assert memory.reserved_bytes == pytest.approx(sum(parts.values())) == pytest.approx(reserved_bytes(s, layout))
    assert memory.reserved_parts == tuple(reserved_parts(s, layout))
    # more process groups, more NCCL buffers
    s2, layout2, _, _ = prepared(LLAMA70, "cluster.nodes=8", "parallel.global_batch_size=32")
    assert reserved_bytes(s2, layout2) == pytest.approx(reserved_bytes(s, layout) + 16 * NCCL_CONNECTION_BYTES)
    # a given size replaces the estimate; a CPU run reserves nothing by default
    s3, layout3, _, _ = prepared(LLAMA70, "training.memory_reserved=3 GiB")
    assert reserved_parts(s3, layout3) == (("memory_reserved", 3 * 2**30),)
    cpu, cpu_layout, _, _ = prepared(SCENARIOS / "validation_2xcpu.yaml")
    assert reserved_bytes(cpu, cpu_layout) == 0


def test_reserved_memory_is_its_own_category_in_the_report(capsys):
    assert main(["run", str(LLAMA70)]) == 0
    out = capsys.readouterr().out
    assert "reserved" in out and "reserved per device: CUDA context" in out


def test_negative_reserved_memory_is_one_clear_error(capsys):
    assert main(["run", str(LLAMA70), "--set", "training.memory_reserved=-1 GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "training.memory_reserved" in err and len(err.splitlines()) == 1


def best_layout(result) -> tuple[tuple, dict]:
    """(point, record) of the fastest simulated layout of a plan."""
    ok = [(r["metrics"]["step_time_s"], i) for i, r in enumerate(result.records) if r and r["status"] == "ok"]
    index = min(ok)[1]
    return result.points[index], result.records[index]


def test_planners_top_pick_leaves_the_reserved_memory_free(tiny):
    options = dict(top=1, max_microbatch_size=1, schedules=("1f1b",), workers=1, progress=False)
    # without reserved memory the fastest layout needs `peak` bytes; give the device just
    # half the reserved memory more than that
    bare = base_scenario(tiny, "dgx-a100", 8, 16, overrides=["training.memory_reserved=0"])
    point, record = best_layout(plan(bare, **options))
    peak = record["metrics"]["peak_memory_bytes"]
    s = apply_fields(base_scenario(tiny, "dgx-a100", 8, 16), dict(point))
    reserved = reserved_bytes(s, resolve(s))
    assert reserved > 2**28  # a quarter GiB at least: the CUDA context alone is 274 MiB
    capacity = peak + reserved / 2
    base = base_scenario(tiny, "dgx-a100", 8, 16, overrides=[f"cluster.system.accelerator.memory.capacity={capacity}"])
    result = plan(base, **options)
    statuses = {p: r["status"] for p, r in zip(result.points, result.records) if r}
    assert statuses[point] == "oom"  # that layout no longer fits once the process's own memory is counted
    top, top_record = best_layout(result)
    s = apply_fields(base, dict(top))
    layout = resolve(s)
    assert top_record["metrics"]["peak_memory_bytes"] <= capacity
    for memory in rank_memory(s, layout, plan_schedule(s, layout), build_workload(s, layout)):
        assert memory.reserved_bytes == pytest.approx(reserved_bytes(s, layout)) and memory.reserved_bytes > 0
        assert capacity - (memory.peak_memory_bytes - memory.reserved_bytes) >= memory.reserved_bytes


def test_reserved_memory_counts_against_the_capacity():
    # the same layout with nothing reserved needs exactly the reserved bytes less
    def peak(*extra):
        s, layout, workload, _ = prepared(LLAMA70, *extra)
        memory = rank_memory(s, layout, plan_schedule(s, layout), workload)[0]
        return memory.peak_memory_bytes, reserved_bytes(s, layout)

    (auto, reserved), (none, _) = peak(), peak("training.memory_reserved=0")
    assert auto - none == pytest.approx(reserved, rel=1e-9) and reserved > 0


# --- parameter all-gather overlapped with the forward; Megatron-Core's buckets -------------------------------------

def test_bucket_size_is_megatron_cores_default():
    _, _, _, small = prepared(LLAMA8, "parallel.zero_stage=1")  # DP 8
    assert bucket_params(small) == 40_000_000
    _, _, _, large = prepared(LLAMA8, "cluster.nodes=64", "parallel.dp=64", "parallel.global_batch_size=512")
    assert bucket_params(large) == 64_000_000
    _, _, _, given = prepared(LLAMA8, "training.grad_reduce_bucket_bytes=80 MB")
    assert bucket_params(given) == 20_000_000  # fp32 gradients
    assert bucket_sizes(100e6, small) == (40e6, 40e6, 20e6)  # full buckets first, in backward order
    assert bucket_sizes(100e6, small, bucketed=False) == (100e6,)


def test_only_pipeline_rank_0s_first_chunk_is_bucketed():
    result = simulate(scenario(LLAMA70, "cluster.nodes=8", "parallel.global_batch_size=32"))
    buckets = result.engine_input.grad_buckets
    assert len(buckets[0]) > 1
    assert all(len(buckets[stage]) == 1 for stage in range(1, result.layout.num_stages))
    readies = [bucket.ready_fraction for bucket in buckets[0]]
    assert readies == sorted(readies) and readies[-1] == pytest.approx(1.0)


def step_and_optimizer(path, *sets: str) -> tuple[float, tuple[float, ...]]:
    s, layout, workload, model = prepared(path, *sets)
    return simulate(s).timeline.step_time_s, optimizer_steps(workload, plan_schedule(s, layout), model)


@pytest.mark.parametrize("path,sets", [
    (LLAMA8, ("parallel.zero_stage=1",)),  # one pipeline rank, its chunk bucketed
    (LLAMA70, ("cluster.nodes=8", "parallel.global_batch_size=32", "parallel.zero_stage=1", "parallel.vpp=2",
               "parallel.schedule=interleaved-1f1b")),  # interleaved: gathers dispatched at the step's start
])
def test_param_gather_overlapped_with_the_forward_shortens_the_step(path, sets):
    plain_step, plain = step_and_optimizer(path, *sets)
    overlapped_step, overlapped = step_and_optimizer(path, *sets, "training.overlap_param_gather=true")
    assert all(after < before for after, before in zip(overlapped, plain))
    assert overlapped_step < plain_step


def test_param_gather_at_the_first_forward_of_every_pipeline_rank_delays_the_fill():
    # Megatron-Core without interleaving: ranks after the first gather their chunk as one bucket,
    # dispatched in the pre-hook of their first forward, on the pipeline's critical path
    sets = ("cluster.nodes=8", "parallel.global_batch_size=32", "parallel.zero_stage=1")
    plain_step, _ = step_and_optimizer(LLAMA70, *sets)
    overlapped_step, _ = step_and_optimizer(LLAMA70, *sets, "training.overlap_param_gather=true")
    assert overlapped_step > plain_step


def test_exposed_param_gather_is_the_first_bucket_at_least_and_the_whole_gather_at_most():
    s, layout, workload, model = prepared(LLAMA8, "parallel.zero_stage=1")
    work = workload.stages[0]
    sizes = bucket_sizes(work.params, model)
    assert len(sizes) > 1
    gathers = [param_gather_s_bytes(model, params) for params in sizes]
    assert param_gather_s([work], model) > 0
    busy = param_gather_exposed_s(work, model, forward_compute_s=10.0, bucketed=True, aligned=False)
    idle = param_gather_exposed_s(work, model, forward_compute_s=0.0, bucketed=True, aligned=False)
    # a long forward hides every bucket but the first, and runs beside the others on the SMs they
    # leave it (cost/contention.py)
    share = model.comm_sm_fraction
    assert share > 0
    assert busy == pytest.approx(gathers[0] + share * sum(gathers[1:]), rel=1e-9)
    assert idle == pytest.approx(sum(gathers), rel=1e-9)  # a forward with no compute hides nothing
    middle = param_gather_exposed_s(work, model, forward_compute_s=sum(gathers) / 2, bucketed=True, aligned=False)
    assert gathers[0] < middle < sum(gathers)
    # dispatched at the step's start while the stage waits for its input anyway: hidden
    assert param_gather_exposed_s(work, model, 1.0, bucketed=False, aligned=True, head_s=100.0) == 0.0


def param_gather_s_bytes(model: CostModel, params: float) -> float:
    from mpsim.cost.collectives import collective_time

    return collective_time("all-gather", params * 2, model.placements["zero"], model.system)
