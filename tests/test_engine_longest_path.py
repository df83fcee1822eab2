"""The longest-path evaluator gives the SimPy engine's timeline: random inputs and shipped scenarios."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, GradBucket, simulate
from mpsim.engine.core import duration_key
from mpsim.engine.longest_path import simulate_fast, supports
from mpsim.errors import InputError
from mpsim.explore.bounds import step_lower_bound
from mpsim.schedules import SCHEDULES, Action, Schedule
from mpsim.schedules.actions import GATHERING
from mpsim.schedules.unshard import mark_unsharding
from mpsim.simulate import simulate as simulate_scenario
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS, registered_schedule

RELATIVE = 1e-9
durations = st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_infinity=False)


def reduction_seconds(longest: float):
    """A gradient reduction's seconds: none, or at least a nanosecond. A duration far below what
    ``close`` resolves (1e-12 s) vanishes when added to seconds, and the contended engine (which
    carries ready buckets as one flow) and the longest path (which adds them one by one) then
    disagree on whether it leaves a record: a float artefact, not a schedule."""
    return st.one_of(st.just(0.0), st.floats(1e-9, longest))


@st.composite
def engine_inputs(draw):
    """A random registered schedule with random durations, transfers, buckets, syncs and options."""
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    pp = draw(st.integers(1, 5))
    low = max(1, getattr(SCHEDULES[name], "min_vpp", 1))
    high = getattr(SCHEDULES[name], "max_vpp", 3) or 3
    vpp = draw(st.integers(low, max(low, min(high, 3))))
    micro = draw(st.integers(1, 10))
    schedule = registered_schedule(name, pp, vpp, micro)
    if draw(st.booleans()):  # FSDP under the pipeline: some passes gather their parameters first
        schedule = mark_unsharding(schedule)
    action_s = {}
    for items in schedule.actions:
        for item in items:
            key = duration_key(item)
            if key not in action_s:
                action_s[key] = draw(durations)
    for key in [key for key in action_s if len(key) == 2 and key[1].endswith(GATHERING)]:
        # a pass that gathers first is the same pass and a gather: never shorter
        plain = action_s.setdefault((key[0], key[1].removesuffix(GATHERING)), draw(durations))
        action_s[key] = plain + action_s[key]
    for stage in range(schedule.num_stages):  # the forward of every stage (the bound reads it)
        action_s.setdefault((stage, "F"), draw(durations))
    transfer_s = {}
    for stage in range(schedule.num_stages - 1):
        transfer_s[(stage, stage + 1)] = draw(st.floats(0, 1))
        transfer_s[(stage + 1, stage)] = draw(st.floats(0, 1))
    buckets = {stage: tuple(GradBucket(fraction, draw(reduction_seconds(1.0)))
                            for fraction in sorted(draw(st.lists(st.floats(0, 1), max_size=3))))
               for stage in range(schedule.num_stages)}
    action_buckets = {}  # reductions started by every run of an action (ZeRO-2/3)
    for key in sorted(action_s, key=str):
        if len(key) == 2 and key[1] in ("B", "W", "F") and draw(st.booleans()):
            action_buckets[key] = (GradBucket(draw(st.floats(0, 1)), draw(reduction_seconds(0.5))),)
    ranks = schedule.num_ranks
    pair_syncs = ()
    if ranks > 1 and draw(st.booleans()):
        pair_syncs = ((0, ranks - 1, draw(st.floats(0, 1)), "tied embedding"),)
    return EngineInput(schedule, action_s, transfer_s, buckets, draw(st.booleans()), pair_syncs,
                       tuple(draw(st.floats(0, 1)) for _ in range(ranks)), draw(st.booleans()),
                       send_blocking_with_receive=draw(st.booleans()), action_buckets=action_buckets)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b)) + 1e-12


def assert_same_timeline(inp: EngineInput, engine=None) -> None:
    engine = engine or simulate(inp)
    fast = simulate_fast(inp)
    assert close(fast.step_time_s, engine.step_time_s)
    for mine, theirs in zip(fast.actions, engine.actions, strict=True):
        assert [r.action for r in mine] == [r.action for r in theirs]
        for a, b in zip(mine, theirs):
            assert close(a.start_s, b.start_s) and close(a.end_s, b.end_s) and close(a.ready_s, b.ready_s)
            assert (a.input_sent_s is None) == (b.input_sent_s is None)
    assert all(close(a, b) for a, b in zip(fast.rank_end_s, engine.rank_end_s, strict=True))
    assert sorted((t.src_rank, t.dst_rank, str(t.action)) for t in fast.transfers) == \
        sorted((t.src_rank, t.dst_rank, str(t.action)) for t in engine.transfers)
    assert len(fast.syncs) == len(engine.syncs)
    assert len(fast.send_waits) == len(engine.send_waits)


@settings(max_examples=200, deadline=None)
@given(engine_inputs())
def test_fast_path_equals_engine_on_random_inputs(inp):
    assert supports(inp)
    assert_same_timeline(inp)


@settings(max_examples=100, deadline=None)
@given(engine_inputs())
def test_lower_bound_never_exceeds_the_step_time(inp):
    bound = step_lower_bound(inp.schedule, inp.action_s, inp.transfer_s, inp.finalize_s)
    assert bound.lower_bound_s <= simulate(inp).step_time_s * (1 + 1e-12) + 1e-12


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_fast_path_equals_engine_on_shipped_scenarios(path):
    # the longest path applies where links are not shared; with contention it defers to the engine
    contended = simulate_scenario(load_scenario(path).scenario)
    assert not supports(contended.engine_input)
    result = simulate_scenario(load_scenario(path, ["training.network_contention=false"]).scenario)
    assert simulate_fast(result.engine_input).step_time_s == pytest.approx(result.timeline.step_time_s,
                                                                            rel=RELATIVE)
    assert_same_timeline(result.engine_input, result.timeline)


def test_fast_path_reports_a_deadlock_like_the_engine():
    # rank 0 waits for the gradient of microbatch 0 before sending its activation: neither can start
    stuck = Schedule("stuck", 1, (0, 1), ((Action(0, "B", 0), Action(0, "F", 0)),
                                           (Action(1, "F", 0), Action(1, "B", 0))))
    inp = EngineInput(stuck, {(0, "F"): 1.0, (0, "B"): 1.0, (1, "F"): 1.0, (1, "B"): 1.0}, {})
    with pytest.raises(RuntimeError, match="stalled: rank 0") as fast:
        simulate_fast(inp)
    with pytest.raises(RuntimeError) as engine:
        simulate(inp)
    assert str(fast.value) == str(engine.value)


def test_an_item_the_fast_path_does_not_know_goes_to_the_engine():
    odd = Schedule("odd", 1, (0,), (("not an action",),))
    assert not supports(EngineInput(odd, {}, {}))


def test_bad_schedule_is_an_input_error_not_a_crash():
    from mpsim.explore.evaluate import simulate_scenario as simulate_with

    scenario = load_scenario(SCENARIOS / "llama3_70b_32xh100.yaml", ["parallel.schedule=no-such-schedule"]).scenario
    with pytest.raises(InputError, match="unknown schedule"):
        simulate_with(scenario)


@settings(max_examples=60, deadline=None)
@given(engine_inputs(), st.lists(st.integers(0, 6), min_size=1, max_size=4))
def test_a_walk_stopped_at_limits_and_resumed_gives_the_same_timeline(inp, steps):
    # the steady-state evaluator walks a schedule layer by layer; stopping and going on
    # must not change a time (the order of evaluation cannot)
    from mpsim.engine.longest_path import Walk

    walk = Walk(inp)
    reached = [0] * inp.schedule.num_ranks
    for step in steps:
        reached = [limit + step for limit in reached]
        walk.advance(reached)
        assert all(p <= limit for p, limit in zip(walk.position, reached))
    walk.advance()
    resumed, whole = walk.finish(), simulate_fast(inp)
    assert resumed.step_time_s == whole.step_time_s
    assert [[(r.index, r.start_s, r.end_s) for r in records] for records in resumed.actions] == \
        [[(r.index, r.start_s, r.end_s) for r in records] for records in whole.actions]
