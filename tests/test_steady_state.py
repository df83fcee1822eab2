"""Steady-state skipping gives the SimPy engine's step time, and skips only what repeats exactly."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, GradBucket, rank_spans, simulate, simulate_fast, simulate_steady
from mpsim.engine.core import duration_key
from mpsim.engine.steady import MAX_PERIOD
from mpsim.schedules import Action, Schedule, build_schedule
from tests.conftest import registered_schedule

RELATIVE = 1e-9
PERIODIC = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1")


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b)) + 1e-12


@st.composite
def long_inputs(draw, names=PERIODIC):
    """A schedule with enough microbatches to have a steady middle, random times and options."""
    name = draw(st.sampled_from(names))
    pp = draw(st.integers(2, 4))
    vpp = 2 if name == "interleaved-1f1b" else 1
    micro = draw(st.integers(4, 12)) * (pp if name == "interleaved-1f1b" else 1) * 2
    schedule = registered_schedule(name, pp, vpp, micro)
    seconds = st.floats(0.0, 5.0, allow_nan=False)
    action_s = {}
    for items in schedule.actions:
        for item in items:
            action_s.setdefault(duration_key(item), draw(seconds))
    transfer_s = {}
    for stage in range(schedule.num_stages - 1):
        transfer_s[(stage, stage + 1)] = draw(st.floats(0, 1))
        transfer_s[(stage + 1, stage)] = draw(st.floats(0, 1))
    buckets = {stage: (GradBucket(draw(st.floats(0, 1)), draw(st.floats(0, 1))),)
               for stage in range(schedule.num_stages)}
    action_buckets = {key: (GradBucket(draw(st.floats(0, 1)), draw(st.floats(0, 0.5))),)
                      for key in sorted(action_s, key=str) if key[1] in ("B", "W") and draw(st.booleans())}
    ranks = schedule.num_ranks
    return EngineInput(schedule, action_s, transfer_s, buckets, draw(st.booleans()),
                       ((0, ranks - 1, draw(st.floats(0, 1)), "tied embedding"),),
                       tuple(draw(st.floats(0, 1)) for _ in range(ranks)), draw(st.booleans()),
                       action_buckets=action_buckets)


@settings(max_examples=60, deadline=None)
@given(long_inputs())
def test_skipping_gives_the_engines_step_time(inp):
    engine, steady = simulate(inp), simulate_steady(inp)
    assert close(steady.step_time_s, engine.step_time_s)
    assert all(close(a, b) for a, b in zip(steady.rank_end_s, engine.rank_end_s, strict=True))
    # the optimizer steps and the tied-embedding sync come after every rank's gradients, as in the engine
    finals = [sorted((s.rank, s.kind, s.start_s, s.end_s) for s in t.syncs if s.kind != "dp-comm")
              for t in (steady, engine)]
    assert len(finals[0]) == len(finals[1])
    for a, b in zip(*finals):
        assert a[:2] == b[:2] and close(a[2], b[2]) and close(a[3], b[3])
    # what was evaluated is a record of the engine's, at the same time
    for mine, theirs in zip(steady.actions, engine.actions, strict=True):
        for record in mine:
            other = theirs[record.index]
            assert other.action == record.action
            assert close(other.start_s, record.start_s) and close(other.end_s, record.end_s)


def test_a_long_1f1b_skips_its_middle_and_keeps_the_step_time():
    schedule = build_schedule("1f1b", 4, 1, 64)
    action_s = {(s, "F"): 1.0 + 0.1 * s for s in range(4)} | {(s, "B"): 2.0 + 0.3 * s for s in range(4)}
    transfer_s = {(a, b): 0.05 for a in range(4) for b in range(4) if abs(a - b) == 1}
    inp = EngineInput(schedule, action_s, transfer_s, send_blocking=True)
    steady, full = simulate_steady(inp), simulate_fast(inp)
    assert steady.skipped and steady.skipped_items > 0
    assert sum(len(r) for r in steady.actions) + steady.skipped_items == sum(len(r) for r in full.actions)
    assert close(steady.step_time_s, simulate(inp).step_time_s)
    # the slowest stage (the last) sets the cycle: its forward, its backward, and with blocking
    # sends the gradient it sends back before its next forward may start
    _, shift, cycle_s, _ = steady.skipped[0]
    assert shift == 1 and close(cycle_s, 1.3 + 2.9 + 0.05)


def test_a_middle_that_repeats_every_few_layers_is_skipped_in_blocks():
    """1F1B on three stages whose sends do not block: each rank's state repeats every three
    layers (three microbatches), not every one; the walk skips whole blocks of three and keeps
    the step time, and a block's cycle is the spacing of the full run's passes three
    microbatches apart."""
    schedule = build_schedule("1f1b", 3, 1, 48)
    action_s = {(s, "F"): 1.0 for s in range(3)} | {(s, "B"): 2.0 for s in range(3)}
    transfer_s = {(a, b): 0.25 for a in range(3) for b in range(3) if abs(a - b) == 1}
    inp = EngineInput(schedule, action_s, transfer_s, send_blocking=False)
    steady, full = simulate_steady(inp), simulate_fast(inp)
    assert steady.skipped
    blocks, shift, cycle_s, per_block = steady.skipped[0]
    assert shift == 3 and per_block == (6, 6, 6) and blocks >= 10
    starts = {record.action: record.start_s for record in full.actions[0]}
    assert close(cycle_s, starts[Action(0, "B", 24)] - starts[Action(0, "B", 21)])
    assert cycle_s > 3 * (1.0 + 2.0)  # not a whole block of passes back to back: rank 0 waits
    assert sum(len(r) for r in steady.actions) + steady.skipped_items == sum(len(r) for r in full.actions)
    assert close(steady.step_time_s, simulate(inp).step_time_s)


def test_periods_up_to_the_longest_compared_are_skipped_and_longer_ones_evaluated_in_full():
    """1F1B whose sends do not block repeats every ``n`` layers on ``n`` stages: up to
    ``MAX_PERIOD`` layers back the walk finds it (the longest period it compares included),
    past that it evaluates the step in full; the step time is the engine's either way."""
    for stages in (MAX_PERIOD - 1, MAX_PERIOD, MAX_PERIOD + 1):
        schedule = build_schedule("1f1b", stages, 1, 12 * stages, timer=rank_spans)
        action_s = {(s, k): 1.0 for s in range(stages) for k in ("F", "B")}
        transfer_s = {(a, b): 0.25 for a in range(stages) for b in range(stages) if abs(a - b) == 1}
        inp = EngineInput(schedule, action_s, transfer_s, send_blocking=False)
        steady = simulate_steady(inp)
        assert [shift for _, shift, _, _ in steady.skipped] == ([stages] if stages <= MAX_PERIOD else [])
        assert close(steady.step_time_s, simulate(inp).step_time_s)


def test_a_middle_that_does_not_repeat_is_evaluated_in_full():
    # one rank runs its forwards in an order with no period: nothing may be skipped
    micro = 24
    order = [(7 * k) % micro for k in range(micro)]
    actions = (tuple(Action(0, "F", m) for m in order) + tuple(Action(0, "B", m) for m in order),
               tuple(item for m in order for item in (Action(1, "F", m), Action(1, "B", m))))
    schedule = Schedule("shuffled", micro, (0, 1), actions)
    inp = EngineInput(schedule, {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 1.5, (1, "B"): 2.5},
                      {(0, 1): 0.1, (1, 0): 0.1})
    steady = simulate_steady(inp)
    assert not steady.skipped
    assert steady.step_time_s == simulate_fast(inp).step_time_s
    assert close(steady.step_time_s, simulate(inp).step_time_s)


def test_full_timeline_on_request_is_every_record():
    inp = EngineInput(build_schedule("1f1b", 3, 1, 30), {(s, k): 1.0 for s in range(3) for k in "FB"},
                      {(a, b): 0.1 for a in range(3) for b in range(3) if abs(a - b) == 1})
    full = simulate_steady(inp, full_timeline=True)
    assert [len(r) for r in full.actions] == [60, 60, 60]
    assert full.step_time_s == simulate_fast(inp).step_time_s


def test_a_stage_slower_in_the_middle_has_no_period_to_break():
    # durations are per (stage, kind): a schedule's items repeat, so do their times; changing one
    # stage's time changes the cycle, and skipping still follows the engine
    base = EngineInput(build_schedule("1f1b", 3, 1, 40), {(s, k): 1.0 for s in range(3) for k in "FB"},
                       {(a, b): 0.0 for a in range(3) for b in range(3) if abs(a - b) == 1})
    slow = replace(base, action_s={**base.action_s, (1, "B"): 3.5})
    for inp in (base, slow):
        assert close(simulate_steady(inp).step_time_s, simulate(inp).step_time_s)
    assert simulate_steady(slow).skipped[0][2] == 4.5
