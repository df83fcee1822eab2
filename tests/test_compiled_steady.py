"""The compiled loop without records jumps over a pipeline's repeated periods and keeps the step.

Against the SimPy engine and the full compiled evaluation (records on): step time, rank
ends and syncs equal to 1e-9 relative; and it does skip where the period is exact, and
evaluates everything where it is not, or where a row read afterwards lies in the middle.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, GradBucket, simulate
from mpsim.engine.compiled import _compiled, available, simulate_compiled
from mpsim.schedules import Action, Schedule, build_schedule
from tests.test_compiled import assert_close_timelines
from tests.test_engine_longest_path import close
from tests.test_steady_state import long_inputs

pytestmark = pytest.mark.skipif(not available(), reason="numba is not installed (pip install 'mpsim[fast]')")


@st.composite
def periodic_inputs(draw):
    """``long_inputs`` (1F1B, GPipe, interleaved, zero bubble; blocking or not, random times and buckets),
    most often without per-action reductions, so that the middle may be skipped."""
    inp = draw(long_inputs(("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p")))
    if draw(st.integers(0, 3)):
        inp = replace(inp, action_buckets={})
    return inp


@settings(max_examples=80, deadline=None)
@given(periodic_inputs())
def test_skipping_gives_the_engines_and_the_full_evaluations_step(inp):
    bare, full, engine = simulate_compiled(inp, records=False), simulate_compiled(inp), simulate(inp)
    assert_close_timelines(bare, full)
    assert_close_timelines(bare, engine)
    if bare.skipped:
        assert not inp.action_buckets or all(key[1] not in ("B", "W") for key in inp.action_buckets)


@settings(max_examples=40, deadline=None)
@given(periodic_inputs())
def test_the_live_slots_of_each_boundary_are_those_of_the_first_moved_up(inp):
    # checked against the definition: produced by a row before the boundary, consumed at or after it
    c = _compiled(inp.schedule, periodic=True)
    period = c.period
    if period is None:
        return
    rows = len(c.rank)
    producer, consumer = {}, {}
    for row in range(rows):
        for j in range(2):
            if c.gives[row, j] >= 0:
                producer[int(c.gives[row, j])] = row
            if c.needs[row, j] >= 0:
                consumer[int(c.needs[row, j])] = row

    def live(boundary: int) -> list[int]:
        return sorted(s for s, row in producer.items() if row < boundary <= consumer.get(s, rows))

    assert live(period.first_row) == period.live.tolist()
    for k in range(period.boundaries + 1):
        assert live(period.first_row + k * period.rows) == [s + k * period.shift for s in period.live.tolist()]
    # and every row of the repeated run has its image one period later
    end = period.first_row + period.boundaries * period.rows
    for row in range(period.first_row, end):
        image = row + period.rows
        assert c.rank[row] == c.rank[image] and c.key[row] == c.key[image]
        assert [s + period.shift if s >= 0 else -1 for s in c.needs[row]] == c.needs[image].tolist()


def _uniform_1f1b(micro: int, blocking: bool = True, **options) -> EngineInput:
    schedule = build_schedule("1f1b", 4, 1, micro)
    action_s = {(s, "F"): 1.0 + 0.1 * s for s in range(4)} | {(s, "B"): 2.0 + 0.3 * s for s in range(4)}
    transfer_s = {(a, b): 0.05 for a in range(4) for b in range(4) if abs(a - b) == 1}
    return EngineInput(schedule, action_s, transfer_s, send_blocking=blocking, **options)


@pytest.mark.parametrize("blocking", [True, False])
def test_a_long_1f1b_skips_its_middle(blocking):
    buckets = {s: (GradBucket(0.5, 0.2),) for s in range(4)}
    inp = _uniform_1f1b(256, blocking, grad_buckets=buckets, pair_syncs=((0, 3, 0.1, "tied embedding"),),
                        finalize_s=(0.3, 0.3, 0.3, 0.3))
    bare = simulate_compiled(inp, records=False)
    assert bare.skipped and bare.skipped_items > 0
    # most of the step is skipped: about 2 x 4 x 256 rows in all
    assert bare.skipped_items > 1500
    assert_close_timelines(bare, simulate_compiled(inp))
    assert_close_timelines(bare, simulate(inp))
    periods, shift, cycle_s, rows_per_rank = bare.skipped[0]
    assert shift == 1 and rows_per_rank == (2, 2, 2, 2) and bare.skipped_items == periods * 8
    # the slowest stage (the last) sets the cycle: its forward and backward, and with blocking
    # sends the gradient it sends back before its next forward may start
    assert close(cycle_s, 1.3 + 2.9 + (0.05 if blocking else 0.0))


def test_a_middle_that_does_not_repeat_is_evaluated_in_full():
    # one rank runs its forwards in an order with no period: nothing may be skipped
    micro = 24
    order = [(7 * k) % micro for k in range(micro)]
    actions = (tuple(Action(0, "F", m) for m in order) + tuple(Action(0, "B", m) for m in order),
               tuple(item for m in order for item in (Action(1, "F", m), Action(1, "B", m))))
    inp = EngineInput(Schedule("shuffled", micro, (0, 1), actions),
                      {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 1.5, (1, "B"): 2.5}, {(0, 1): 0.1, (1, 0): 0.1})
    bare = simulate_compiled(inp, records=False)
    assert not bare.skipped and bare.skipped_items == 0
    assert bare.rank_end_s == simulate_compiled(inp).rank_end_s
    assert close(bare.step_time_s, simulate(inp).step_time_s)


def test_a_short_pipeline_is_evaluated_in_full():
    # as many microbatches as stages: no steady middle at all
    inp = _uniform_1f1b(4)
    bare = simulate_compiled(inp, records=False)
    assert not bare.skipped and bare.rank_end_s == simulate_compiled(inp).rank_end_s


@pytest.mark.parametrize("overlap", [True, False])
def test_reductions_started_in_the_middle_are_evaluated_in_full(overlap):
    # ZeRO-2/3: every backward of stage 1 queues a reduction, so rows in the middle are read afterwards
    inp = _uniform_1f1b(128, overlap_grad_sync=overlap, action_buckets={(1, "B"): (GradBucket(0.5, 0.4),)},
                        grad_buckets={s: (GradBucket(1.0, 0.2),) for s in range(4)})
    bare = simulate_compiled(inp, records=False)
    assert not bare.skipped
    assert len([s for s in bare.syncs if s.label.startswith("1B")]) == 128
    assert_close_timelines(bare, simulate_compiled(inp))
    assert_close_timelines(bare, simulate(inp))
    # the same input without them skips
    assert simulate_compiled(replace(inp, action_buckets={}), records=False).skipped


def test_stage_times_that_do_not_add_up_exactly_in_floating_point_still_repeat():
    """Sixteen stages of slightly different times and 0.1 s transfers: in floating point their
    sums round differently as the clock grows and no two boundaries' states were ever equal
    (nothing was skipped before the loop took its times on a power-of-two grid). On the grid
    the middle repeats exactly and is skipped, and the step is the full evaluation's to 1e-9."""
    import random

    from mpsim.engine import rank_spans

    pp, microbatches = 16, 256
    schedule = build_schedule("1f1b", pp, 1, microbatches, timer=rank_spans)
    action_s = {(stage, kind): random.Random(stage).uniform(0.9, 1.1) * (2 if kind == "B" else 1)
                for stage in range(pp) for kind in ("F", "B")}
    transfer_s = {(a, b): 0.1 for a in range(pp) for b in range(pp) if abs(a - b) == 1}
    inp = EngineInput(schedule, action_s, transfer_s)
    bare = simulate_compiled(inp, records=False)
    assert bare.skipped_items > 0.8 * 2 * pp * microbatches
    assert_close_timelines(bare, simulate_compiled(inp))
    assert close(bare.step_time_s, simulate(inp).step_time_s)


@pytest.mark.parametrize("transfer_s", [0.1, 0.125])
def test_a_state_that_repeats_only_every_few_periods_is_found_and_skipped(transfer_s):
    """Uniform 1F1B stages with transfers settle into a pattern over several layers (most
    layers take F + B + 2 transfers, some only F + B): no two consecutive boundaries match,
    but a boundary matches one a few periods back, and the whole repetition is jumped."""
    from mpsim.engine import rank_spans

    pp, microbatches = 16, 256
    schedule = build_schedule("1f1b", pp, 1, microbatches, timer=rank_spans)
    action_s = {(stage, kind): 2.0 if kind == "B" else 1.0 for stage in range(pp) for kind in ("F", "B")}
    transfers = {(a, b): transfer_s for a in range(pp) for b in range(pp) if abs(a - b) == 1}
    inp = EngineInput(schedule, action_s, transfers)
    full = simulate_compiled(inp)
    middle = [r.start_s for r in full.actions[7]][40:80:2]
    assert len({round(b - a, 9) for a, b in zip(middle, middle[1:])}) > 1  # not the same every layer
    bare = simulate_compiled(inp, records=False)
    assert bare.skipped_items > 0.8 * 2 * pp * microbatches
    assert_close_timelines(bare, full)
    assert close(bare.step_time_s, simulate(inp).step_time_s)
