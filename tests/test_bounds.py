"""The planner's step-time lower bound: never above the step, and tight where the schedule's
structure alone decides the step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, rank_spans, simulate
from mpsim.engine.dpstream import GradBucket
from mpsim.explore.bounds import backward_tails, exposed_reduction_s, step_lower_bound
from mpsim.schedules import build_schedule
from tests.test_engine_longest_path import engine_inputs
from tests.test_uncontended import contended_inputs


def _bound(inp: EngineInput) -> float:
    """The bound with everything of ``inp`` it reads, DP buckets included."""
    return step_lower_bound(inp.schedule, inp.action_s, inp.transfer_s, inp.finalize_s,
                            grad_buckets=inp.grad_buckets, overlap_grad_sync=inp.overlap_grad_sync).lower_bound_s


@settings(max_examples=150, deadline=None)
@given(contended_inputs())
def test_the_bound_holds_with_contention_too(inp: EngineInput):
    """Shared links only slow transfers and reductions down: the bound, priced from the
    transfers alone, stays below the contended step."""
    bound = step_lower_bound(inp.schedule, inp.action_s, inp.transfer_s, inp.finalize_s)
    assert bound.lower_bound_s <= simulate(inp).step_time_s * (1 + 1e-12) + 1e-12


@settings(max_examples=300, deadline=None)
@given(st.one_of(engine_inputs(), contended_inputs()))
def test_the_bound_with_gradient_reductions_holds(inp: EngineInput):
    """Every schedule, with or without overlapped reductions, ZeRO-2/3 per-action buckets, tied
    embeddings, blocking sends and shared links: the exposed-reduction term never passes the step."""
    assert _bound(inp) <= simulate(inp).step_time_s * (1 + 1e-12) + 1e-12


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24), st.floats(0.1, 3.0), st.floats(0.1, 3.0), st.floats(0.0, 1.0),
       st.floats(0.0, 2.0), st.booleans())
def test_the_bound_is_the_1f1b_step_with_its_last_reduction(pp, microbatches, forward_s, backward_s, optimizer_s,
                                                             reduction_s, overlap):
    """Uniform stages, one bucket per stage ready at the end of its last backward: the first stage
    finishes last, (m + p - 1)(F + B), then reduces and steps; the bound finds exactly that, with
    the reduction apart, whether the reductions overlap the backward or wait for the last item."""
    schedule = build_schedule("1f1b", pp, 1, microbatches, timer=rank_spans)
    action_s = {(s, k): t for s in range(pp) for k, t in (("F", forward_s), ("B", backward_s))}
    buckets = {s: (GradBucket(1.0, reduction_s),) for s in range(pp)}
    inp = EngineInput(schedule, action_s, {}, buckets, overlap, finalize_s=(optimizer_s,) * pp)
    step = simulate(inp).step_time_s
    assert step == pytest.approx((microbatches + pp - 1) * (forward_s + backward_s) + reduction_s + optimizer_s,
                                 rel=1e-12)
    bound = step_lower_bound(schedule, action_s, {}, inp.finalize_s, grad_buckets=buckets, overlap_grad_sync=overlap)
    assert bound.lower_bound_s == pytest.approx(step, rel=1e-12)
    assert bound.dp_s == pytest.approx(reduction_s, rel=1e-12)


def test_a_reduction_hides_under_the_rest_of_its_pass():
    """Buckets ready a quarter, half and all of the way into a 4 s pass, 1 s each: from half-way
    on, 2 s of reductions have 2 s of the pass to hide under; the last has none."""
    buckets = [GradBucket(0.25, 1.0), GradBucket(0.5, 1.0), GradBucket(1.0, 1.0)]
    assert exposed_reduction_s(buckets, 4.0) == 1.0
    assert exposed_reduction_s(buckets, 1.0) == pytest.approx(2.25)  # all three from 0.25 s: 3 s less 0.75 s
    assert exposed_reduction_s([], 4.0) == 0.0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24), st.floats(0.1, 3.0), st.floats(0.1, 3.0), st.floats(0.0, 1.0))
def test_the_bound_is_the_1f1b_step_for_uniform_stages(pp, microbatches, forward_s, backward_s, optimizer_s):
    """Uniform stages, free transfers: 1F1B takes (m + p - 1)(F + B) plus the optimizer, and the
    last rank's head, busy time and tail add up to exactly that."""
    schedule = build_schedule("1f1b", pp, 1, microbatches, timer=rank_spans)
    action_s = {(s, k): t for s in range(pp) for k, t in (("F", forward_s), ("B", backward_s))}
    inp = EngineInput(schedule, action_s, {}, finalize_s=(optimizer_s,) * pp)
    step = simulate(inp).step_time_s
    expected = (microbatches + pp - 1) * (forward_s + backward_s) + optimizer_s
    assert step == pytest.approx(expected, rel=1e-12)
    assert step_lower_bound(schedule, action_s, {}, inp.finalize_s).lower_bound_s == pytest.approx(step, rel=1e-12)


def test_the_tail_follows_the_backward_chain_and_its_transfers():
    schedule = build_schedule("1f1b", 3, 1, 4, timer=rank_spans)
    action_s = {(0, "B"): 1.0, (1, "B"): 2.0, (1, "I"): 1.5, (2, "B"): 4.0}
    transfer_s = {(1, 0): 0.25, (2, 1): 0.5}
    # stage 2's gradient: over the 2->1 cut, stage 1's shorter backward pass, over 1->0, stage 0's
    assert backward_tails(schedule, action_s, transfer_s) == [0.0, 0.25 + 1.0, 0.5 + 1.5 + 0.25 + 1.0]
    assert backward_tails(schedule, {(2, "B"): 1.0}, transfer_s) is None  # stage 1 has no backward time
    # a pair that holds stage 1's backward carries it too: the shortest carrier counts
    paired = {**action_s, (2, "F", 1, "B"): 1.25}
    assert backward_tails(schedule, paired, transfer_s)[2] == 0.5 + 1.25 + 0.25 + 1.0
