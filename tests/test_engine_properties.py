"""Invariants of the engine, checked on random schedules and durations (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, GradBucket, rank_spans, simulate
from mpsim.engine.core import TransferSpec
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
    schedule = build_schedule(name, p, v, m, check=True, timer=rank_spans)
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


@st.composite
def contended_inputs(draw):
    """Engine inputs whose transfers and DP buckets share each rank's NIC (in and out)."""
    inp = draw(engine_inputs())
    rank_of = inp.schedule.stage_to_rank
    latency_s = draw(st.floats(0, 0.1))
    links = {(a, b): TransferSpec(latency_s, seconds, (("out", rank_of[a]), ("in", rank_of[b])))
             for (a, b), seconds in inp.transfer_s.items() if rank_of[a] != rank_of[b]}
    nic = {stage: (("out", rank), ("in", rank)) for stage, rank in enumerate(rank_of)}
    buckets = {stage: tuple(bucket._replace(label=f"b{stage}.{i}", links=nic[stage])
                            for i, bucket in enumerate(stage_buckets))
               for stage, stage_buckets in inp.grad_buckets.items()}
    return replace(inp, transfer_links=links, grad_buckets=buckets)


@settings(max_examples=150, deadline=None)
@given(contended_inputs())
def test_with_contention_an_action_starts_as_soon_as_its_rank_and_input_are_ready(inp):
    """Each action starts at the later of its rank being ready (previous action and own
    sends done) and its input landing, never later: no rank oversleeps a transfer."""
    timeline = simulate(inp)
    landed = {(t.action.stage, t.action.kind, t.action.microbatch): t.end_s for t in timeline.transfers}
    rank_of = inp.schedule.stage_to_rank
    for rank, records in enumerate(timeline.actions):
        assert [r.action for r in records] == list(inp.schedule.actions[rank])
        for record in records:
            stage, kind, microbatch = record.action
            source = stage - 1 if kind == "F" else stage + 1  # the stage whose output it needs
            ready = record.ready_s
            if 0 <= source < inp.schedule.num_stages and rank_of[source] != rank:
                ready = max(ready, landed[(source, kind, microbatch)])
            assert record.start_s == pytest.approx(ready, abs=1e-9)
            assert record.end_s - record.start_s == pytest.approx(inp.action_s[(stage, kind)])


@settings(max_examples=150, deadline=None)
@given(contended_inputs())
def test_with_contention_transfers_and_buckets_never_beat_their_time_alone(inp):
    timeline = simulate(inp)
    for t in timeline.transfers:
        consumer_stage = t.action.stage + (1 if t.action.kind == "F" else -1)
        spec = inp.transfer_links[(t.action.stage, consumer_stage)]
        assert t.end_s - t.start_s >= spec.latency_s + spec.busy_s - 1e-9
    alone = {bucket.label: bucket.duration_s for buckets in inp.grad_buckets.values() for bucket in buckets}
    for rank in range(inp.schedule.num_ranks):
        syncs = [s for s in timeline.syncs_of(rank) if s.kind == "dp-comm"]
        for before, after in zip(syncs, syncs[1:]):  # one bucket at a time, in order
            assert after.start_s >= before.end_s - 1e-9
        for sync in syncs:
            assert sync.end_s - sync.start_s >= alone[sync.label.split(" ", 2)[2]] - 1e-9
