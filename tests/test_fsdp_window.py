"""FSDP under torch's pipeline runtime: the window of chunks it keeps gathered (``parallel.fsdp_gathered_chunks``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, simulate as run_engine
from mpsim.results import summarize
from mpsim.schedules import Schedule, build_schedule
from mpsim.schedules.actions import Action, Overlapped, flat, stages_by_rank
from mpsim.schedules.unshard import Gathering, mark_unsharding, rank_gathers, window_changes
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

SCHEDULES = [("interleaved-1f1b", 4, 5, 8), ("interleaved-1f1b", 2, 4, 8), ("interleaved-1f1b", 4, 8, 16),
             ("interleaved-zb", 4, 4, 8), ("looped-bfs", 2, 5, 4), ("zbv", 4, 2, 8), ("dualpipev", 4, 2, 8)]


def torch_window_changes(items, window: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(freed, gathered) before each item as PyTorch's own lowering inserts RESHARD and UNSHARD."""
    from torch.distributed.pipelining.schedules import _Action, _add_unshard_reshard
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    kinds = {"F": Kind.FORWARD, "B": Kind.FULL_BACKWARD, "I": Kind.BACKWARD_INPUT, "W": Kind.BACKWARD_WEIGHT}

    def action(a: Action):
        return _Action(a.stage, kinds[a.kind], a.microbatch)

    lowered = _add_unshard_reshard([_Action(-1, Kind.OVERLAP_F_B, None, (action(i.forward), action(i.backward)))
                                    if isinstance(i, Overlapped) else action(i) for i in items], window)
    changes, freed, gathered = [], [], []
    for step in lowered:
        if step.computation_type == Kind.UNSHARD:
            gathered.append(step.stage_index)
        elif step.computation_type == Kind.RESHARD:
            freed.append(step.stage_index)
        else:
            changes.append((tuple(sorted(freed)), tuple(gathered)))
            freed, gathered = [], []
    return changes


@pytest.mark.parametrize("name,pp,vpp,microbatches", SCHEDULES)
@pytest.mark.parametrize("window", [1, 2, 3, 4])
def test_the_window_is_pytorchs_own_lowering(name, pp, vpp, microbatches, window):
    pytest.importorskip("torch")
    schedule = build_schedule(name, pp, vpp, microbatches)
    for items in schedule.actions:
        ours = [(tuple(sorted(freed)), gathered) for freed, gathered in window_changes(items, window)]
        assert ours == torch_window_changes(items, window)


@settings(max_examples=40)
@given(pp=st.integers(2, 4), vpp=st.integers(4, 8), rounds=st.integers(1, 3), window=st.integers(1, 4),
       reshard=st.booleans())
def test_a_rank_never_holds_more_chunks_than_its_window(pp, vpp, rounds, window, reshard):
    schedule = build_schedule("interleaved-1f1b", pp, vpp, pp * rounds)
    held = stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)
    for rank, items in enumerate(schedule.actions):
        plan = rank_gathers(items, held[rank], Gathering(reshard, window))
        resident = set(plan.start)
        assert len(resident) <= window
        for index, (stage, kind, _) in enumerate(flat(items)):
            for other, sign in plan.before[index]:
                (resident.add if sign > 0 else resident.discard)(other)
            assert len(resident) <= window
            if not reshard:  # nothing but the window frees or gathers: every pass finds its chunk there
                assert stage in resident and plan.change[index] == 0 and not plan.marked[index]
            elif plan.change[index] > 0:  # FSDP's hook gathers for a backward, within the window
                resident.add(stage)
            elif plan.change[index] < 0:  # and frees after a forward
                resident.discard(stage)
        # every chunk gathered again is waited for by its own next item, after the gather was issued
        for issued, stage, used in plan.regathers:
            assert issued <= used and stage in (a.stage for a in flat(items[used:used + 1]))


def test_a_window_as_wide_as_the_chunks_changes_nothing():
    schedule = build_schedule("interleaved-1f1b", 4, 3, 8)
    assert mark_unsharding(schedule, Gathering(True, 3)) == mark_unsharding(schedule)
    held = stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)
    assert rank_gathers(schedule.actions[0], held[0], Gathering(True, 3)) == \
        rank_gathers(schedule.actions[0], held[0], Gathering(True, None))


def test_an_item_waits_for_the_gathers_issued_as_the_runtime_came_to_an_earlier_one():
    # one rank: four forwards of 1 s; the gathers issued before the third item run beside the second,
    # from its start at 1 s, and take 2.5 s: the fourth item waits for them until 3.5 s, not 3 s
    schedule = Schedule("four", 4, (0,), (tuple(Action(0, "F", m) for m in range(4)),))
    plain = EngineInput(schedule, {(0, "F"): 1.0}, {})
    waiting = EngineInput(schedule, {(0, "F"): 1.0}, {}, gathered_after={(0, 3): ((2, 2.5),)})
    assert [r.start_s for r in run_engine(plain).actions[0]] == [0.0, 1.0, 2.0, 3.0]
    timeline = run_engine(waiting)
    assert [r.start_s for r in timeline.actions[0]] == [0.0, 1.0, 2.0, 3.5]
    assert timeline.gather_waits == [(0, 3.0, 3.5)]


LLAMA70B = SCENARIOS / "llama3_70b_32xh100.yaml"
# TP 8, PP 4 with 10 chunks per rank, DP 2, FSDP without resharding after the forward
TEN_CHUNKS = ("parallel.zero_stage=3", "parallel.vpp=10", "parallel.global_batch_size=32", "cluster.nodes=8",
              "parallel.schedule=interleaved-1f1b", "parallel.reshard_after_forward=false")


def run(*overrides: str):
    result = simulate(load_scenario(LLAMA70B, [*TEN_CHUNKS, *overrides]).scenario)
    return result, summarize(result)


def test_the_window_shards_the_weights_and_holds_three_chunks():
    (_, kept), (result, windowed) = run("parallel.fsdp_gathered_chunks=null"), run("parallel.fsdp_gathered_chunks=3")
    assert result.layout.fsdp_windowed and result.layout.weights_sharded
    whole, sharded = kept.memory[0], windowed.memory[0]
    # between its gathers a rank keeps its fp32 shard, the optimizer's master weight (FSDP)
    assert sharded.weights_bytes == pytest.approx(2 * whole.weights_bytes / result.layout.shard_ranks)
    assert sharded.weights_bytes + sharded.optimizer_bytes == pytest.approx(whole.optimizer_bytes)
    chunk = whole.weights_bytes / result.layout.vpp
    # what the walk holds gathered at the peak: more than one chunk, never more than three and the
    # embedding the first chunk carries
    assert chunk < sharded.gathered_params_bytes <= 3.5 * chunk
    assert windowed.peak_memory_bytes < kept.peak_memory_bytes


def test_the_gathers_hide_on_a_fast_network_and_cost_time_on_a_slow_one():
    (_, kept), (_, windowed) = run("parallel.fsdp_gathered_chunks=null"), run("parallel.fsdp_gathered_chunks=3")
    assert windowed.step_time_s == pytest.approx(kept.step_time_s)
    slow = "cluster.system.scale_out.nic_bandwidth=50 Gb/s"
    (_, kept_slow), (result, windowed_slow) = (run("parallel.fsdp_gathered_chunks=null", slow),
                                                 run("parallel.fsdp_gathered_chunks=3", slow))
    assert result.timeline.gather_waits
    assert windowed_slow.step_time_s > kept_slow.step_time_s
    assert windowed_slow.exposed_dp_comm_s > kept_slow.exposed_dp_comm_s
    # more bandwidth is never slower
    times = [run("parallel.fsdp_gathered_chunks=3", f"cluster.system.scale_out.nic_bandwidth={gbps} Gb/s")[1].step_time_s
             for gbps in (25, 50, 100, 200, 400)]
    assert times == sorted(times, reverse=True)


def test_llama3_405b_keeps_every_chunk_gathered_as_its_own_pipeline_did():
    loaded = load_scenario(SCENARIOS / "llama3_405b_16384xh100.yaml")
    layout = simulate(loaded.scenario).layout
    assert loaded.scenario.parallel.fsdp_gathered_chunks is None and not layout.fsdp_windowed
    assert layout.fsdp_whole_step and not layout.weights_sharded


def test_a_chunk_gather_wait_is_drawn_and_named_in_the_pictures(tmp_path):
    from mpsim.results.html.payload import COLORS, KINDS as DRAWN, LABELS, run_payload
    from mpsim.results.idle import KINDS
    from mpsim.results.plot import plot_timeline
    from mpsim.simulate import bubble_reference

    result, summary = run("parallel.fsdp_gathered_chunks=3", "cluster.system.scale_out.nic_bandwidth=50 Gb/s")
    reference = bubble_reference(result)
    summary = summarize(result, reference)
    assert "gather" in KINDS and all(kind in COLORS and kind in LABELS for kind in KINDS)
    payload = run_payload(result, summary, reference, "window")
    assert any(DRAWN.index("gather") in rank["idle"]["kind"] for rank in payload["ranks"])
    plot_timeline(result, summary, str(tmp_path / "timeline.png"))
    assert (tmp_path / "timeline.png").stat().st_size > 0
