"""Steps that overlap their neighbours (engine/consecutive.py, training.optimizer_post_validation):
held items, the chained optimizer steps, the period of a long run by hand and as invariants."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, simulate, supports
from mpsim.engine.consecutive import check_items, steady_period
from mpsim.explore.bounds import step_lower_bound
from mpsim.schedules import build_schedule
from mpsim.schedules.actions import Action, Schedule
from tests.conftest import uniform_input


def _tail_heavy() -> EngineInput:
    """Two stages, one microbatch, split backward; the last stage's weight gradient is long, so
    the first rank is done well before the last one: F 1, I 1, W 1 on rank 0, W 5 on rank 1."""
    schedule = Schedule("tail", 1, (0, 1), ((Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)),
                                             (Action(1, "F", 0), Action(1, "I", 0), Action(1, "W", 0))))
    times = {(0, "F"): 1.0, (0, "I"): 1.0, (0, "W"): 1.0, (1, "F"): 1.0, (1, "I"): 1.0, (1, "W"): 5.0}
    return EngineInput(schedule, times, {(0, 1): 0.0, (1, 0): 0.0}, optimizer_chain=True)


def test_the_period_of_a_long_run_by_hand():
    inp = _tail_heavy()
    first = simulate(inp)
    # rank 0: F [0, 1], I [3, 4], W [4, 5]; rank 1: F [1, 2], I [2, 3], W [3, 8]
    assert first.rank_end_s == [5.0, 8.0]
    # the check of the last update sits at the later of the ranks' last warm-up forwards (rank 1's F
    # at 1): before rank 0's I, before rank 1's F
    assert check_items(first) == [1, 0]
    # step 2: rank 0 starts at 5, rank 1 at 8; rank 1's F 8-9, I 9-10, W 10-15; rank 0's I 10-11,
    # W 11-12: both ranks end 7 s after their last end, and so does every later step
    period = steady_period(inp)
    assert (period.period_s, period.steps, period.repeated) == (7.0, 2, True)


def test_a_held_item_waits_and_the_engine_alone_models_it():
    inp = _tail_heavy()
    held = replace(inp, not_before_s={(0, 0): 2.0})
    timeline = simulate(held)
    assert timeline.actions[0][0].start_s == 2.0 and timeline.rank_end_s == [7.0, 10.0]
    # the longest-path evaluators do not know held items: such an input goes to the engine
    assert supports(inp) and not supports(held)


def test_optimizer_steps_start_in_pipeline_order_when_chained():
    inp = replace(_tail_heavy(), finalize_s=(0.5, 0.5))
    # without the chain each rank steps at its own end; with it rank 1 no earlier than rank 0
    assert simulate(replace(inp, optimizer_chain=False)).rank_end_s == [5.5, 8.5]
    swapped = replace(inp, action_s={**inp.action_s, (0, "W"): 6.0, (1, "W"): 1.0})
    # rank 0 now ends last (W 4-10), rank 1 at 4: its update waits for rank 0's to start
    assert simulate(replace(swapped, optimizer_chain=False)).rank_end_s == [10.5, 4.5]
    assert simulate(swapped).rank_end_s == [10.5, 10.5]


def test_with_a_global_reduction_before_the_update_every_rank_waits_for_the_last():
    inp = replace(_tail_heavy(), finalize_s=(2.0, 0.5), optimizer_chain=False)
    # rank 0 is done at 5, rank 1 at 8: each updates at once, and the step ends at 8.5
    assert simulate(inp).rank_end_s == [7.0, 8.5]
    # the norm's all-reduce holds both until 8: rank 0's longer update ends the step
    assert simulate(replace(inp, optimizer_barrier=True)).rank_end_s == [10.0, 8.5]


def test_scenarios_wait_for_the_norm_unless_they_validate_afterwards(scenarios_dir):
    from mpsim.simulate import optimizer_waits_for_all
    from mpsim.specs import load_scenario

    base = scenarios_dir / "megatron_22b_8xa100.yaml"
    assert optimizer_waits_for_all(load_scenario(base).scenario)  # Megatron's --clip-grad 1.0
    assert not optimizer_waits_for_all(load_scenario(base, ["training.clip_grad=false"]).scenario)
    assert optimizer_waits_for_all(load_scenario(base, ["training.clip_grad=false", "training.dtype=fp16"]).scenario)
    assert not optimizer_waits_for_all(load_scenario(base, ["training.optimizer_post_validation=true"]).scenario)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["1f1b", "zb-h1", "gpipe"]), ranks=st.integers(2, 4), extra=st.integers(0, 4),
       forward=st.floats(0.5, 2.0), backward=st.floats(0.5, 3.0), weight=st.floats(0.1, 0.9),
       optimizer=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4), chain=st.booleans())
def test_a_long_run_is_never_slower_than_steps_one_by_one(name, ranks, extra, forward, backward, weight, optimizer,
                                                          chain):
    schedule = build_schedule(name, ranks, 1, ranks + extra)
    inp = replace(uniform_input(schedule, forward, backward, backward * weight, transfer_s=0.1),
                  finalize_s=tuple(optimizer[:ranks]), optimizer_chain=chain)
    alone = simulate(inp)
    period = steady_period(inp)
    # each rank starts its next step no later than a barrier would let it: never slower
    assert period.period_s <= alone.span_s * (1 + 1e-9)
    # and no rank can do a step's work in less than its own compute and update
    busiest = max(sum(r.end_s - r.start_s for r in records) + optimizer[rank]
                  for rank, records in enumerate(alone.actions))
    assert period.period_s >= busiest * (1 - 1e-9)
    # the planner's bound on such a run's period holds, and is no larger than the one step's
    overlapping = step_lower_bound(schedule, inp.action_s, inp.transfer_s, inp.finalize_s, overlapping_steps=True)
    assert overlapping.lower_bound_s <= period.period_s * (1 + 1e-9)
    assert overlapping.lower_bound_s <= step_lower_bound(schedule, inp.action_s, inp.transfer_s,
                                                         inp.finalize_s).lower_bound_s


def test_a_scenario_with_post_validation_reports_the_period(scenarios_dir):
    from mpsim.results import summarize
    from mpsim.simulate import simulate as simulate_scenario
    from mpsim.specs import load_scenario

    base = scenarios_dir / "megatron_22b_8xa100.yaml"
    settings_ = ["parallel.schedule=zb-h1", "parallel.pp=4", "parallel.tp=2", "parallel.global_batch_size=32"]
    alone = summarize(simulate_scenario(load_scenario(base, settings_).scenario))
    result = simulate_scenario(load_scenario(base, [*settings_, "training.optimizer_post_validation=true"]).scenario)
    overlapped = summarize(result)
    assert overlapped.step_time_s == steady_period(result.engine_input).period_s
    assert overlapped.cross_step_overlap_s == result.timeline.span_s - overlapped.step_time_s >= 0
    assert alone.cross_step_overlap_s == 0 and overlapped.step_time_s <= alone.step_time_s * (1 + 1e-9)
