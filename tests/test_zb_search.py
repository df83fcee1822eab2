"""The zero-bubble schedule search (zb-1p, zb-2p): valid, within its limit, never worse than
the hand-made schedules it competes with, timed as the engine times it, and at least as
good as the Zero Bubble paper's own search on its setups."""

from __future__ import annotations

import random

import pytest

from mpsim.engine import EngineInput, rank_spans, simulate as run_engine
from mpsim.schedules import ScheduleError, build_schedule, search_outline
from mpsim.schedules.actions import Schedule
from mpsim.schedules.registry import canonical_name
from mpsim.schedules.validate import validate
from mpsim.schedules.zb_search import (StageTimes, _split_1f1b, execute, knob_grid, list_schedule, search, zb_1p,
                                        zb_2p)
from mpsim.schedules.zero_bubble import zb_h1, zb_h2
from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS


def random_times(seed: int) -> tuple[StageTimes, int]:
    """Uneven stage times (a heavier last stage, as an LM head makes it) and a transfer time."""
    rng = random.Random(seed)
    pp = rng.choice([2, 3, 4, 6, 8])
    m = rng.choice([pp, 2 * pp, 3 * pp + 1])
    f = [rng.uniform(0.5, 1.5) for _ in range(pp)]
    f[-1] *= rng.uniform(1.0, 1.6)
    i = [x * rng.uniform(0.8, 1.3) for x in f]
    w = [x * rng.uniform(0.3, 1.0) for x in f]
    return StageTimes(tuple(f), tuple(i), tuple(w), rng.uniform(0.0, 0.2)), m


def engine_timing(schedule, times: StageTimes) -> float:
    """When the engine finishes the schedule with these fixed times."""
    action_s = {}
    for stage in range(times.pp):
        action_s.update({(stage, "F"): times.forward_s[stage], (stage, "I"): times.input_grad_s[stage],
                         (stage, "W"): times.weight_grad_s[stage]})
    transfer_s = {}
    for stage in range(times.pp - 1):
        transfer_s[(stage, stage + 1)] = transfer_s[(stage + 1, stage)] = times.transfer_s
    timeline = run_engine(EngineInput(schedule, action_s, transfer_s))
    return max(records[-1].end_s for records in timeline.actions)


@pytest.mark.parametrize("seed", range(12))
def test_searched_schedules_are_valid_within_limit_and_no_worse_than_zb_h(seed):
    times, m = random_times(seed)
    for searched, limit, handmade in ((zb_1p, times.pp, zb_h1), (zb_2p, 2 * times.pp, zb_h2)):
        schedule = searched(times, m, rank_spans)
        validate(schedule)  # every F, I and W once, on its rank, and no deadlock
        timing = execute([list(rank) for rank in schedule.actions], times, rank_spans)
        cap = times.memory_cap(limit)
        assert max(timing.peak_memory) <= cap
        reference = execute([list(rank) for rank in handmade(times.pp, 1, m).actions], times, rank_spans)
        if max(reference.peak_memory) <= cap:
            assert timing.end_s <= reference.end_s + 1e-9


@pytest.mark.parametrize("seed", range(12))
def test_zb_1p_never_ends_after_1f1b_with_its_backward_split(seed):
    """1F1B with each backward run as I then W keeps to ZB-1p's limit, so the search is at least as good."""
    times, m = random_times(200 + seed)
    split = execute([list(rank) for rank in _split_1f1b(times.pp, 1, m).actions], times, rank_spans)
    assert max(split.peak_memory) <= times.memory_cap(times.pp)
    searched = zb_1p(times, m, rank_spans)
    timing = execute([list(rank) for rank in searched.actions], times, rank_spans)
    assert timing.end_s <= split.end_s + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_the_search_times_a_schedule_exactly_as_the_engine_does(seed):
    times, m = random_times(100 + seed)
    for knobs in knob_grid(2 * times.pp)[::7]:
        lists, timing = list_schedule(times, m, knobs)
        schedule = Schedule("zb-2p", m, tuple(range(times.pp)), tuple(tuple(rank) for rank in lists))
        assert engine_timing(schedule, times) == pytest.approx(timing.end_s, rel=1e-12)
        replayed = execute(lists, times, rank_spans)  # the engine's longest-path evaluator
        assert replayed.longest_span_s == pytest.approx(timing.longest_span_s, rel=1e-12)
        assert (replayed.peak_pending, replayed.peak_held) == (timing.peak_pending, timing.peak_held)
        assert replayed.peak_memory == pytest.approx(timing.peak_memory, rel=1e-12)


def test_uniform_times_without_transfers_reach_zb_h2s_zero_bubble():
    times = StageTimes.uniform(4, 1.0, 1.0, 1.0)
    schedule = zb_2p(times, 12, rank_spans, objective="span")
    timing = execute([list(rank) for rank in schedule.actions], times, rank_spans)
    assert timing.longest_span_s == pytest.approx(12 * 3.0)


# Qi et al. 2024, Table 5 (bubble rate of their automatic ZB-2p) and Table 9 (profiled
# T_F, T_B, T_W, T_comm), from shared/validation/zero_bubble_main_tables3_4_5_9.csv
PAPER_ZB2P = [((8, 24, 18.522, 18.086, 9.337, 0.601), 0.0433),
              ((8, 64, 18.546, 18.097, 9.321, 0.762), 0.0026),
              ((16, 48, 11.347, 11.248, 8.132, 0.377), 0.0066)]


@pytest.mark.parametrize("setup,paper", PAPER_ZB2P, ids=["1.5B-m24", "1.5B-m64", "14.6B-m48"])
def test_zb_2p_is_at_least_as_good_as_the_papers_search(setup, paper):
    pp, m, tf, tb, tw, tcomm = setup
    times = StageTimes.uniform(pp, tf, tb, tw, tcomm)
    schedule = zb_2p(times, m, rank_spans, objective="span")
    timing = execute([list(rank) for rank in schedule.actions], times, rank_spans)
    busy = m * (tf + tb + tw)
    rate = (timing.longest_span_s - busy) / timing.longest_span_s
    assert rate <= paper + 5e-5  # the paper prints four decimals


def test_zb_1p_is_not_torchs_zb1p_alias():
    assert canonical_name("zb-1p") == "zb-1p"
    assert canonical_name("ZB_2P") == "zb-2p"
    assert canonical_name("zb1p") == "interleaved-zb"  # torch's ScheduleInterleavedZeroBubble


@pytest.mark.parametrize("torch_class,name", [
    ("ScheduleGPipe", "gpipe"), ("Schedule1F1B", "1f1b"), ("ScheduleInterleaved1F1B", "interleaved-1f1b"),
    ("ScheduleLoopedBFS", "looped-bfs"), ("ScheduleInterleavedZeroBubble", "interleaved-zb"),
    ("ScheduleZBVZeroBubble", "zbv"), ("ScheduleDualPipeV", "dualpipev")])
def test_torchs_class_names_name_their_schedules(torch_class, name):
    assert canonical_name(torch_class) == name


def scenario_times(result) -> StageTimes:
    """A simulated scenario's stage times and memory, as the search gets them."""
    stages = range(result.schedule.num_stages)
    return StageTimes(*(tuple(result.costs[(s, kind)].duration_s for s in stages) for kind in "FIW"), 0.0,
                      tuple(result.workload.stages[s].activation_bytes for s in stages),
                      tuple(result.workload.stages[s].weight_grad_buffer_bytes for s in stages))


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_a_scenario_searches_with_its_own_stage_times_and_memory(recompute):
    scenario = load_scenario(SCENARIOS / "megatron_22b_8xa100.yaml",
                             ["parallel.tp=2", "parallel.pp=4", "parallel.dp=1", "parallel.global_batch_size=32",
                              "parallel.schedule=zb-1p", f"parallel.recompute={recompute}"]).scenario
    searched = simulate(scenario)
    assert searched.schedule.name == "zb-1p"
    validate(searched.schedule)
    times = scenario_times(searched)
    timing = execute([list(rank) for rank in searched.schedule.actions], times, rank_spans)
    assert max(timing.peak_memory) <= times.memory_cap(4)  # p microbatches' worth, weight gradients included
    h1 = simulate(scenario.model_copy(update={"parallel": scenario.parallel.model_copy(
        update={"schedule": "zb-h1"})}))
    if max(execute([list(rank) for rank in h1.schedule.actions], times, rank_spans).peak_memory) <= \
            times.memory_cap(4):
        assert searched.timeline.step_time_s <= h1.timeline.step_time_s + 1e-9


def test_pending_weight_gradients_count_against_the_limit():
    """As the authors' scheduler counts memory (a forward's activations, half of which a pending
    weight gradient keeps in its example setting): on uniform times ZB-1p holds what 1F1B holds
    and has ZB-H1's bubble, (p - 1)(T_F + T_B - T_W); ZB-2p reaches zero bubble within 2p."""
    times = StageTimes.uniform(4, 1.0, 1.0, 1.0)
    one = execute([list(rank) for rank in zb_1p(times, 12, rank_spans, objective="span").actions], times,
                  rank_spans)
    assert max(one.peak_memory) == pytest.approx(4.0)
    assert one.longest_span_s == pytest.approx(12 * 3.0 + 3 * (1.0 + 1.0 - 1.0))
    two = execute([list(rank) for rank in zb_2p(times, 12, rank_spans, objective="span").actions], times,
                  rank_spans)
    assert max(two.peak_memory) <= 8.0 and two.longest_span_s == pytest.approx(12 * 3.0)


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        search(StageTimes.uniform(2, 1, 1, 1), 4, 0, rank_spans)


def test_a_step_runs_one_search_the_one_with_its_own_times(monkeypatch):
    """``simulate`` starts a searched schedule from its frame: the unit-time search the registry
    runs for printing is not run, and the step is the one a unit-time schedule handed in gives."""
    import mpsim.schedules.registry as registry

    scenario = load_scenario(SCENARIOS / "megatron_22b_8xa100.yaml",
                             ["parallel.tp=2", "parallel.pp=4", "parallel.dp=1", "parallel.global_batch_size=32",
                              "parallel.schedule=zb-2p"]).scenario
    layout = resolve(scenario)
    handed = simulate(scenario, schedule=build_schedule("zb-2p", layout.pp, layout.vpp, layout.num_microbatches,
                                                        timer=rank_spans))
    calls = []
    unit = registry.SCHEDULES["zb-2p"]
    monkeypatch.setitem(registry.SCHEDULES, "zb-2p", unit.__class__(
        lambda *args: calls.append(args) or unit.generator(*args), unit.min_vpp, unit.max_vpp, unit.description,
        unit.chains, unit.searched))
    own = simulate(scenario)
    assert calls == []
    assert own.schedule.actions == handed.schedule.actions
    assert own.timeline.step_time_s == handed.timeline.step_time_s


def test_a_searched_frame_refuses_what_the_registry_refuses():
    frame = search_outline("zb-1p", 4, 1, 12)
    assert (frame.num_ranks, frame.num_stages, frame.num_microbatches) == (4, 4, 12)
    assert all(rank == () for rank in frame.actions)
    for args in [("zb-1p", 4, 2, 12), ("zb-2p", 8, 1, 200_000)]:
        with pytest.raises(ScheduleError) as framed:
            search_outline(*args)
        with pytest.raises(ScheduleError) as built:
            build_schedule(*args, timer=rank_spans)
        assert str(framed.value) == str(built.value)
    with pytest.raises(ValueError, match="not a searched schedule"):
        search_outline("1f1b", 4, 1, 12)


@pytest.mark.parametrize("seed", range(40))
def test_the_next_free_stage_is_the_earliest_later_entry_of_the_heap(seed):
    # the search wakes a waiting stage when the next other stage is free; it walks the heap
    # instead of reading all of it, and must find what reading all of it finds
    import heapq

    from mpsim.schedules.zb_list import Knobs, _ListScheduler
    rng = random.Random(seed)
    scheduler = _ListScheduler(StageTimes.uniform(2, 1.0, 1.0, 1.0), 2, Knobs(2, 0.0, 0.0, None))
    times = [float(rng.choice([0, 1, 2, 3])) + rng.choice([0.0, 0.5]) for _ in range(rng.randint(0, 40))]
    scheduler.clock = [(t, order, order % 7) for order, t in enumerate(times)]
    heapq.heapify(scheduler.clock)
    for now in (-1.0, 0.0, 0.5, 1.0, 2.5, 3.5, 9.0):
        later = [t for t in times if t > now]
        assert scheduler._next_other(now) == (min(later) if later else None)


def _random_stage_times(rng: random.Random) -> tuple[StageTimes, int]:
    pp = rng.randint(1, 9)
    m = rng.randint(1, 3 * pp + 2)
    forward = tuple(rng.choice([1.0, rng.uniform(0.5, 2.0)]) for _ in range(pp))
    input_grad = tuple(rng.choice([1.0, rng.uniform(0.5, 2.5)]) for _ in range(pp))
    weight_grad = tuple(rng.uniform(0.2, 1.5) for _ in range(pp))
    memory = None if rng.random() < 0.5 else tuple(rng.uniform(0.5, 2.0) for _ in range(pp))
    kept = None if memory is None or rng.random() < 0.5 else tuple(x * rng.uniform(0.2, 1.2) for x in memory)
    return StageTimes(forward, input_grad, weight_grad, rng.choice([0.0, 0.05, 0.3]), memory, kept), m


@pytest.mark.parametrize("seed", range(30))
def test_the_array_scheduler_builds_the_references_lists_to_the_bit(seed):
    # the loop numba compiles, run as Python and compiled, against the plain-Python reference:
    # the same actions in the same order and the same timing, every float equal
    from mpsim.jit import compiled
    from mpsim.schedules.zb_list import _from_arrays, list_schedule_reference
    from mpsim.schedules.zb_list_arrays import list_schedule_arrays
    rng = random.Random(seed)
    times, m = _random_stage_times(rng)
    loop = compiled(list_schedule_arrays)
    for knobs in knob_grid(rng.choice([times.pp, 2 * times.pp])):
        reference = list_schedule_reference(times, m, knobs)
        assert _from_arrays(times, m, knobs, list_schedule_arrays) == reference, knobs
        if loop is not None:
            assert _from_arrays(times, m, knobs, loop) == reference, knobs
        assert list_schedule(times, m, knobs) == reference
