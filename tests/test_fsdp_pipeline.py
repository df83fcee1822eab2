"""FSDP under a pipeline schedule: gradients reduced once per step (Layout.fsdp_pipelined); without
resharding after the forward each chunk stays gathered for the step (Layout.fsdp_whole_step), with it
a pass gathers only where the chunk's parameters were freed (mpsim/schedules/unshard.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.balance.auto import partition_problem
from mpsim.balance.partition import balance
from mpsim.cost.actions import CostModel
from mpsim.cost.step import final_grad_buckets
from mpsim.engine.core import duration_key
from mpsim.explore.evaluate import schedule_for, simulate_scenario
from mpsim.explore.memfast import LayoutMemory, ShortWalk
from mpsim.explore.memwalk import item_keys
from mpsim.explore.plancache import short_schedule
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.results.memory import rank_memory, walk_peak
from mpsim.schedules import SCHEDULES, build_schedule
from mpsim.schedules.actions import Action, Schedule, Unsharding, flat
from mpsim.schedules.unshard import Gathering, mark_unsharding
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.layout import resolve_layout
from mpsim.workload import build_workload
from mpsim.workload.memory import GATHERED_PARAM_BYTES
from tests.conftest import SCENARIOS, registered_schedule

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"
BASE = ("parallel.tp=4",)  # TP 4 x PP 4 x DP 2: a pipeline, and two ranks to shard over
HELD = (*BASE, "parallel.zero_stage=3", "parallel.reshard_after_forward=false")
RESHARDING = (*BASE, "parallel.zero_stage=3", "parallel.reshard_after_forward=true")


def prepared(*overrides: str):
    s = load_scenario(LLAMA70, list(overrides)).scenario
    layout = resolve(s)
    return s, layout, build_workload(s, layout), CostModel(s, layout)


def gathers(work) -> int:
    return sum(block.gather is not None for passes in (work.forward, work.backward) for block in passes)


def test_under_a_pipeline_no_block_gathers_and_one_reduce_scatter_per_layer_after_the_last_backward():
    _, layout, workload, model = prepared(*HELD)
    assert layout.pp > 1 and layout.fsdp_whole_step and layout.state_zero_stage == 1
    work = workload.stages[1]
    assert gathers(work) == 0
    buckets = final_grad_buckets(work, model)
    scatters = [b for b in buckets if "FSDP grad reduce-scatter" in b[2]]
    assert len(scatters) == work.layers
    assert [b[0] for b in scatters] == pytest.approx([(i + 1) / work.layers for i in range(work.layers)])


def test_without_a_pipeline_the_per_microbatch_gathers_stay():
    _, layout, workload, _ = prepared(*HELD, "parallel.pp=1")
    assert not layout.fsdp_pipelined and layout.state_zero_stage == 3 and layout.weights_sharded
    assert gathers(workload.stages[0]) > 0


def test_resharding_under_a_pipeline_reduces_once_and_prices_the_gathering_passes_apart():
    _, layout, workload, model = prepared(*RESHARDING)
    assert layout.fsdp_unsharding and not layout.fsdp_whole_step and layout.state_zero_stage == 1
    work, gathering = workload.stages[1], workload.unsharding[1]
    assert gathers(work) == 0 and gathers(gathering) == 2 * work.layers  # its forward's and its backward's
    releases = [block for passes in (gathering.backward, gathering.backward_input) for block in passes
                if block.release is not None]
    assert not releases  # no reduce-scatter per microbatch
    scatters = [b for b in final_grad_buckets(work, model) if "FSDP grad reduce-scatter" in b[2]]
    assert len(scatters) == work.layers
    result = simulate(prepared(*RESHARDING)[0])
    assert not any("fsdp_reduce_scatter" in bucket.label for buckets in result.engine_input.action_buckets.values()
                   for bucket in buckets)
    plain, first = result.costs[(1, "F")], result.costs[(1, "F+gather")]
    assert first.duration_s > plain.duration_s


@pytest.mark.parametrize("name,pp,vpp", [("1f1b", 4, 1), ("interleaved-1f1b", 2, 2), ("zb-h1", 4, 1)])
def test_each_rank_gathers_once_per_microbatch_and_chunk(name, pp, vpp):
    # a backward keeps what it gathered, so the forward after it gathers nothing: one gather
    # per microbatch and chunk (the first forward's is the step's opening gather), where
    # gathering for both passes would be two
    microbatches = 8
    schedule = mark_unsharding(build_schedule(name, pp, vpp, microbatches))
    for items in schedule.actions:
        marked = [a for a in flat(items) if type(a) is Unsharding]
        assert len(marked) == microbatches * vpp
        assert all(a.kind != "W" for a in marked)
    assert mark_unsharding(schedule) == schedule  # marking twice changes nothing


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(SCHEDULES)), st.integers(1, 5), st.integers(1, 3), st.integers(1, 12))
def test_every_chunk_gathers_once_per_forward_on_any_schedule(name, pp, vpp, microbatches):
    # only a forward frees the parameters, and the chunk's next forward, backward or input-gradient
    # pass gathers them again: as many gathers as forwards, whatever the order, pairs included
    schedule = registered_schedule(name, pp, vpp, microbatches)
    marked = mark_unsharding(schedule)
    assert marked == schedule
    for items in marked.actions:
        actions = flat(items)
        for stage in {a.stage for a in actions}:
            mine = [a for a in actions if a.stage == stage]
            assert sum(type(a) is Unsharding for a in mine) == sum(a.kind == "F" for a in mine)
            assert not any(type(a) is Unsharding for a in mine if a.kind == "W")
            assert type(mine[0]) is not Unsharding  # gathered at the start of the step


def test_the_planners_bound_reads_the_gathering_passes_keys():
    # the step's lower bound counts each rank's items by their duration keys (memwalk.item_keys)
    schedule = mark_unsharding(build_schedule("1f1b", 2, 1, 4))
    for items in schedule.actions:
        assert item_keys(items) == [duration_key(item) for item in items]
        assert any(kind.endswith("+gather") for _, kind in item_keys(items))


def test_a_forward_after_its_chunks_backward_gathers_nothing():
    schedule = mark_unsharding(build_schedule("1f1b", 2, 1, 4))
    last = [(str(a), type(a) is Unsharding) for a in schedule.actions[1]]
    assert last == [("1F0", False), ("1B0", True), ("1F1", False), ("1B1", True), ("1F2", False), ("1B2", True),
                    ("1F3", False), ("1B3", True)]


def test_resharding_gathers_more_than_holding_and_holds_less_weight_memory():
    s_held, layout_held, workload_held, _ = prepared(*HELD)
    s_re, layout_re, workload_re, _ = prepared(*RESHARDING)
    held, resharding = simulate(s_held), simulate(s_re)
    assert summarize(resharding).step_time_s > summarize(held).step_time_s
    memory_held = rank_memory(s_held, layout_held, held.schedule, workload_held)
    memory_re = rank_memory(s_re, layout_re, resharding.schedule, workload_re)
    for a, b in zip(memory_re, memory_held):
        # FSDP: between the passes only the fp32 shard, which is the optimizer's master weight the
        # held run counts with its optimizer state; the held run keeps the gathered bf16 weights too
        assert a.weights_bytes + a.optimizer_bytes == pytest.approx(b.optimizer_bytes)
        assert a.weights_bytes == pytest.approx(2 * b.weights_bytes / layout_re.shard_ranks)
        assert a.grads_bytes == pytest.approx(b.grads_bytes)  # accumulated unsharded for the step
    # DeepSpeed's ZeRO-3 keeps a bf16 partition beside its fp32 master: the bf16 weights sharded
    s_ds, layout_ds, workload_ds, _ = prepared(*RESHARDING, "parallel.zero_impl=deepspeed")
    memory_ds = rank_memory(s_ds, layout_ds, simulate(s_ds).schedule, workload_ds)
    for a, b in zip(memory_ds, memory_held):
        assert a.weights_bytes == pytest.approx(b.weights_bytes / layout_ds.shard_ranks)
        assert a.optimizer_bytes == pytest.approx(b.optimizer_bytes)


def _stage(params_bytes: float, activation_bytes: float) -> SimpleNamespace:
    """A stage for the memory walk: its gathered parameters' bytes and one microbatch's activations."""
    return SimpleNamespace(params=params_bytes / GATHERED_PARAM_BYTES, expert_params=0.0,
                           activation_bytes=activation_bytes, weight_grad_buffer_bytes=0.0)


def test_a_backward_keeps_its_chunks_parameters_in_the_memory_walk():
    # two microbatches through one chunk of 10 bytes of weights and 4 of activations each: the
    # start holds the weights (10), the forwards free them (4, then 8), the first backward gathers
    # them and keeps them beside the second microbatch's activations (4 + 10): the peak
    workload = SimpleNamespace(stages=[_stage(10.0, 4.0)])
    two = Schedule("two", 2, (0,), ((Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)),))
    assert walk_peak(two, 0, workload).bytes == pytest.approx(8.0)
    walked = walk_peak(two, 0, workload, gathering=Gathering(reshard_after_forward=True))
    assert walked.bytes == pytest.approx(14.0) and walked.gathered_params_bytes == pytest.approx(10.0)
    assert walked.in_flight == 1


def test_the_step_holds_zero_1_state_and_gathers_once():
    s3, layout, workload, _ = prepared(*HELD)
    s1, layout1, workload1, _ = prepared(*BASE, "parallel.zero_stage=1")
    held = summarize(simulate(s3))
    per_microbatch = summarize(simulate(load_scenario(LLAMA70, [*BASE, "parallel.zero_stage=3"]).scenario))
    assert held.step_time_s < per_microbatch.step_time_s  # one gather per chunk and step, not per microbatch
    memory3 = rank_memory(s3, layout, simulate(s3).schedule, workload)
    memory1 = rank_memory(s1, layout1, simulate(s1).schedule, workload1)
    for a, b in zip(memory3, memory1):
        # unsharded weights and fp32 gradients for the step, the optimizer state sharded: ZeRO-1's
        assert a.weights_bytes == pytest.approx(b.weights_bytes)
        assert a.grads_bytes == pytest.approx(b.grads_bytes)
        assert a.optimizer_bytes == pytest.approx(b.optimizer_bytes)


@pytest.mark.parametrize("schedule,vpp", [("interleaved-1f1b", 2), ("dualpipev", 2)])
def test_the_fast_engines_and_the_event_engine_agree_on_gathering_passes(schedule, vpp):
    s = prepared(*RESHARDING, f"parallel.schedule={schedule}", f"parallel.vpp={vpp}")[0]
    fast = simulate_scenario(s, engine="fast")
    assert any(kind.endswith("+gather") for key in fast.costs for kind in key[1::2])
    assert summarize(fast).step_time_s == summarize(simulate_scenario(s, engine="simpy")).step_time_s


def test_the_planners_memory_check_finds_the_peak_after_a_backward():
    # short sequences: a chunk's gathered weights outweigh a microbatch's activations, so the
    # fullest moment follows a backward, which the walk shortened to the states after forwards
    # would miss
    s, layout, workload, _ = prepared(*RESHARDING, "model.seq_length=1024")
    full = schedule_for(s, layout, None)
    expected = max(rank_memory(s, layout, full, workload), key=lambda m: m.peak_memory_bytes)
    assert expected.gathered_params_bytes > 0
    check = LayoutMemory(s, layout, workload)
    short = short_schedule(s, layout)
    assert check.fullest(short.idle, short.memory).peak_memory_bytes == expected.peak_memory_bytes
    assert check.fullest(short.idle, ShortWalk.of(full)).peak_memory_bytes < expected.peak_memory_bytes


def test_auto_balancing_prices_one_gather_per_unit_and_microbatch_when_resharding():
    # layers_per_stage: auto weighs each layer by its passes; resharding after the forward adds
    # the gather its backward makes, holding the parameters for the step adds none
    held, resharding = (partition_problem(s, resolve_layout(s)) for s in
                        (prepared(*HELD)[0], prepared(*RESHARDING)[0]))
    assert all(a > b for a, b in zip(resharding.unit_s, held.unit_s))
    assert resharding.extra_s[0] > held.extra_s[0] and resharding.extra_s[-1] > held.extra_s[-1]


@pytest.mark.parametrize("sequence,zero_impl", [(8192, "fsdp"), (1024, "fsdp"), (8192, "deepspeed")])
def test_auto_balancing_budgets_the_parameters_a_backward_keeps_when_resharding(sequence, zero_impl):
    # a unit's state under resharding: the weights' shard (FSDP's is the fp32 master the optimizer
    # state holds anyway; DeepSpeed keeps a bf16 one beside it), where holding the parameters for the
    # step keeps them whole, plus what the parameters gathered whole add beyond one microbatch's
    # activations (at 8K tokens a layer's activations outweigh its parameters, at 1K its parameters theirs)
    settings = (f"model.seq_length={sequence}", f"parallel.zero_impl={zero_impl}")
    held, resharding = (partition_problem(s, resolve_layout(s)) for s in
                        (prepared(*HELD, *settings)[0], prepared(*RESHARDING, *settings)[0]))
    _, layout, workload, _ = prepared(*RESHARDING, *settings)
    layer = workload.stages[1]
    whole = layer.params / layer.layers * GATHERED_PARAM_BYTES
    added = [r - h for r, h in zip(resharding.unit_state_bytes, held.unit_state_bytes)]
    excess = [max(0.0, whole - activation) for activation in resharding.unit_activation_bytes]
    shard = whole / layout.shard_ranks if zero_impl == "deepspeed" else 0.0
    assert added == pytest.approx([shard - whole + e for e in excess])
    assert all(e > 0 for e in excess) == (sequence == 1024) and any(e > 0 for e in excess) == (sequence == 1024)


@pytest.mark.parametrize("overrides", [
    RESHARDING,  # the split chosen without the gathered parameters put rank 1 at 80.65 GiB of 80
    (*BASE, "parallel.zero_stage=1"),
    (*RESHARDING, "model.seq_length=4096", "parallel.schedule=zb-h1"),  # weight-gradient buffers
    # with DeepSpeed's bf16 partition, so that the budget binds here (FSDP's lighter state lets
    # the split found without a budget fit)
    (*RESHARDING, "model.seq_length=4096", "parallel.schedule=interleaved-1f1b", "parallel.vpp=2",
     "parallel.zero_impl=deepspeed"),
], ids=["resharding", "zero-1", "resharding zb-h1", "resharding interleaved"])
def test_a_split_the_memory_budget_admits_fits_in_the_memory_table(overrides):
    # the budget bounds the memory walk: state, each part of the activations and what a split backward
    # keeps at its own peak, gathered parameters beyond a microbatch, the table's buffers and reserve
    scenario = prepared(*overrides, "parallel.layers_per_stage=auto")[0]
    counts = balance(partition_problem(scenario, resolve_layout(scenario)))
    assert counts is not None
    result = simulate(scenario)
    assert tuple(w.layers for w in result.workload.stages) == counts
    memory = rank_memory(result.scenario, result.layout, result.schedule, result.workload)
    assert all(m.fits for m in memory), [round(m.peak_memory_bytes / 2**30, 2) for m in memory]


@pytest.mark.parametrize("sequence", [8192, 16384])
def test_the_budget_counts_the_lm_heads_deferred_weight_gradients(sequence):
    # Megatron's deferred embedding weight gradients keep the head's inputs until the drain; the budget
    # builds the schedule with that deferral, as the run does, so a split it admits fits (at 16K tokens
    # it had admitted (19, 21, 20, 20) with the last rank at 83.41 GiB of 80)
    scenario = load_scenario(LLAMA70, ["parallel.layers_per_stage=auto", "training.defer_embedding_wgrad=true",
                                       "parallel.global_batch_size=64", f"model.seq_length={sequence}"]).scenario
    counts = balance(partition_problem(scenario, resolve_layout(scenario)))
    assert (counts is None) == (sequence == 16384)
    if counts is not None:
        result = simulate(scenario)
        memory = rank_memory(result.scenario, result.layout, result.schedule, result.workload)
        assert all(m.fits for m in memory)


def test_a_chunks_last_pass_frees_its_parameters_in_the_memory_walk():
    # two chunks on one rank, one after the other: after the first chunk's last backward its
    # gradients are reduced and its parameters freed, so the second chunk's forward peaks without them
    workload = SimpleNamespace(stages=[_stage(10.0, 1.0), _stage(5.0, 100.0)])
    two = Schedule("two", 1, (0, 0), ((Action(0, "F", 0), Action(0, "B", 0), Action(1, "F", 0), Action(1, "B", 0)),))
    walked = walk_peak(two, 0, workload, gathering=Gathering(reshard_after_forward=True))
    # the start holds both chunks (15); the second forward holds its 100 of activations alone
    assert walked.bytes == pytest.approx(100.0) and walked.gathered_params_bytes == 0.0
