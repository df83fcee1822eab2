"""The compiled longest path gives the Python walk's timeline bit for bit, and the engine's step time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from mpsim.engine import EngineInput, simulate, simulate_fast
from mpsim.engine.compiled import _compiled, available, simulate_compiled
from mpsim.schedules import Action, Schedule
from tests.test_engine_longest_path import close, engine_inputs
from tests.test_steady_state import long_inputs

pytestmark = pytest.mark.skipif(not available(), reason="numba is not installed (pip install 'mpsim[fast]')")


def _sync_key(sync):
    return (sync.rank, sync.kind, sync.label, sync.start_s, sync.end_s)


def assert_same_as_walk(inp: EngineInput) -> None:
    walk, compiled = simulate_fast(inp), simulate_compiled(inp)
    # same float operations in the same order per rank and per link: equal, not merely close
    assert compiled.actions == walk.actions
    assert compiled.rank_end_s == walk.rank_end_s
    assert sorted(compiled.transfers) == sorted(walk.transfers)
    assert sorted(map(_sync_key, compiled.syncs)) == sorted(map(_sync_key, walk.syncs))
    assert sorted(compiled.send_waits) == sorted(walk.send_waits)
    bare = simulate_compiled(inp, records=False)
    assert bare.actions == [[] for _ in walk.actions]
    if _compiled(inp.schedule, periodic=True).period is None:  # nothing rebased: the same numbers
        assert bare.rank_end_s == walk.rank_end_s
        assert sorted(map(_sync_key, bare.syncs)) == sorted(map(_sync_key, walk.syncs))
    else:  # rebased at each period (compiled_steady.py): equal to rounding
        assert_close_timelines(bare, walk)


def assert_close_timelines(mine, theirs) -> None:
    """Step time, rank ends and syncs equal to 1e-9 relative."""
    assert close(mine.step_time_s, theirs.step_time_s)
    assert all(close(a, b) for a, b in zip(mine.rank_end_s, theirs.rank_end_s, strict=True))
    mine_syncs, their_syncs = sorted(map(_sync_key, mine.syncs)), sorted(map(_sync_key, theirs.syncs))
    assert len(mine_syncs) == len(their_syncs)
    for a, b in zip(mine_syncs, their_syncs):
        assert a[:3] == b[:3] and close(a[3], b[3]) and close(a[4], b[4])


@settings(max_examples=150, deadline=None)
@given(engine_inputs())
def test_compiled_equals_the_walk_and_the_engine_on_random_inputs(inp):
    assert_same_as_walk(inp)
    engine = simulate(inp)
    compiled = simulate_compiled(inp, records=False)
    assert close(compiled.step_time_s, engine.step_time_s)
    assert all(close(a, b) for a, b in zip(compiled.rank_end_s, engine.rank_end_s, strict=True))


@settings(max_examples=40, deadline=None)
@given(long_inputs())
def test_compiled_equals_the_walk_on_long_pipelines(inp):
    assert_same_as_walk(inp)


def test_a_deadlock_is_reported_as_the_walk_reports_it():
    stuck = Schedule("stuck", 1, (0, 1), ((Action(0, "B", 0), Action(0, "F", 0)),
                                           (Action(1, "F", 0), Action(1, "B", 0))))
    inp = EngineInput(stuck, {(0, "F"): 1.0, (0, "B"): 1.0, (1, "F"): 1.0, (1, "B"): 1.0}, {})
    with pytest.raises(RuntimeError) as walk:
        simulate_fast(inp)
    with pytest.raises(RuntimeError) as compiled:
        simulate_compiled(inp)
    assert str(compiled.value) == str(walk.value)


def test_a_new_duration_for_the_same_schedule_is_not_read_from_the_cache():
    schedule = Schedule("two", 1, (0, 1), ((Action(0, "F", 0), Action(0, "B", 0)),
                                            (Action(1, "F", 0), Action(1, "B", 0))))
    times = {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 1.0, (1, "B"): 2.0}
    first = simulate_compiled(EngineInput(schedule, times, {(0, 1): 0.5, (1, 0): 0.5}))
    second = simulate_compiled(EngineInput(schedule, {**times, (1, "B"): 4.0}, {(0, 1): 0.5, (1, 0): 0.5}))
    # F0 1, send 0.5, F1 1, B1 2 or 4, send 0.5, B0 2
    assert first.step_time_s == 1 + 0.5 + 1 + 2 + 0.5 + 2
    assert second.step_time_s == first.step_time_s + 2
