"""Invariants of the engine, checked on random schedules and durations (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, GradBucket, simulate
from mpsim.schedules import build_schedule

durations = st.floats(min_value=0.01, max_value=5.0, allow_nan=False, allow_infinity=False)


@st.composite
def engine_inputs(draw, blocking=None):
    p = draw(st.integers(1, 6))
    m = draw(st.integers(1, 12))
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]))
    v = 1
    if name == "interleaved-1f1b":
        v = draw(st.integers(2, 3))
        rounds = max(1, m // p)
        m = (m // rounds) * rounds
    schedule = build_schedule(name, p, v, m, check=True)
    stages = schedule.num_stages
    action_s = {}
    for stage in range(stages):
        action_s[(stage, "F")] = draw(durations)
        action_s[(stage, "B")] = draw(durations)
    transfer_s = {}
    for stage in range(stages - 1):
        transfer_s[(stage, stage + 1)] = draw(st.floats(0, 1))
        transfer_s[(stage + 1, stage)] = draw(st.floats(0, 1))
    buckets = {stage: (GradBucket(0.5, draw(st.floats(0, 1))), GradBucket(1.0, draw(st.floats(0, 1))))
               for stage in range(stages)}
    send_blocking = draw(st.booleans()) if blocking is None else blocking
    return EngineInput(schedule, action_s, transfer_s, buckets, draw(st.booleans()),
                       finalize_s=tuple(draw(st.floats(0, 1)) for _ in range(p)), send_blocking=send_blocking)


@settings(max_examples=150, deadline=None)
@given(engine_inputs())
def test_every_action_runs_once_in_list_order(inp):
    timeline = simulate(inp)
    for rank, actions in enumerate(inp.schedule.actions):
        assert [r.action for r in timeline.actions[rank]] == list(actions)


@settings(max_examples=150, deadline=None)
@given(engine_inputs())
def test_no_rank_computes_two_things_at_once(inp):
    timeline = simulate(inp)
    for records in timeline.actions:
        for before, after in zip(records, records[1:]):
            assert after.start_s >= before.end_s - 1e-12
        for record in records:
            assert record.end_s - record.start_s == pytest.approx(inp.action_s[(record.action.stage, record.action.kind)])


@settings(max_examples=150, deadline=None)
@given(engine_inputs())
def test_dependencies_are_respected(inp):
    timeline = simulate(inp)
    end = {}
    start = {}
    for records in timeline.actions:
        for r in records:
            end[tuple(r.action)] = r.end_s
            start[tuple(r.action)] = r.start_s
    rank_of = inp.schedule.stage_to_rank
    for (stage, kind, mb), begin in start.items():
        if kind == "F" and stage > 0:
            transfer = inp.transfer_s[(stage - 1, stage)] if rank_of[stage - 1] != rank_of[stage] else 0.0
            assert begin >= end[(stage - 1, "F", mb)] + transfer - 1e-9
        if kind == "B":
            assert begin >= end[(stage, "F", mb)] - 1e-9
            if stage < inp.schedule.num_stages - 1:
                transfer = inp.transfer_s[(stage + 1, stage)] if rank_of[stage + 1] != rank_of[stage] else 0.0
                assert begin >= end[(stage + 1, "B", mb)] + transfer - 1e-9


def _scaled(inp: EngineInput, compute: float, comm: float) -> EngineInput:
    return EngineInput(inp.schedule, {k: v * compute for k, v in inp.action_s.items()},
                       {k: v * comm for k, v in inp.transfer_s.items()},
                       {s: tuple(GradBucket(b.ready_fraction, b.duration_s * comm) for b in bs)
                        for s, bs in inp.grad_buckets.items()},
                       inp.overlap_grad_sync, inp.pair_syncs, tuple(f * compute for f in inp.finalize_s),
                       inp.send_blocking)


@settings(max_examples=150, deadline=None)
@given(engine_inputs(), st.floats(0.1, 1.0), st.floats(0.1, 1.0))
def test_faster_compute_or_links_never_slow_the_step(inp, compute, comm):
    base = simulate(inp).step_time_s
    assert simulate(_scaled(inp, compute, 1.0)).step_time_s <= base + 1e-9
    assert simulate(_scaled(inp, 1.0, comm)).step_time_s <= base + 1e-9
    assert simulate(_scaled(inp, compute, comm)).step_time_s <= base + 1e-9


@settings(max_examples=60, deadline=None)
@given(engine_inputs())
def test_deterministic(inp):
    first, second = simulate(inp), simulate(inp)
    assert first.actions == second.actions
    assert first.rank_end_s == second.rank_end_s
