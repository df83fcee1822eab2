"""Megatron-Core's deferred LM-head weight gradients (``training.defer_embedding_wgrad``,
``wgrad_deferral_limit``): the schedule transform, the head stage's two passes, what the
buffer costs in memory and what the drain saves in time."""

from __future__ import annotations

import pytest

from mpsim.engine import simulate as run_engine, simulate_fast, supports
from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.schedules import build_schedule
from mpsim.schedules.actions import Action
from mpsim.schedules.deferral import defer_head_weight_grads
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import compute_ops
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"  # TP 8 (sequence parallel), PP 4, 1F1B, 16 microbatches


@pytest.mark.parametrize("limit, deferred", [(3, [0, 1, 2]), (0, list(range(8))), (20, list(range(8)))])
def test_the_first_backwards_of_the_head_stage_leave_their_weight_gradient_to_the_end(limit, deferred):
    schedule = build_schedule("1f1b", 4, 1, 8)
    moved = defer_head_weight_grads(schedule, limit)
    head_rank = schedule.stage_to_rank[3]
    assert moved.actions[:head_rank] == schedule.actions[:head_rank]  # the other ranks run as before
    before, after = schedule.actions[head_rank], moved.actions[head_rank]
    assert [a.microbatch for a in after if a.kind == "I"] == deferred
    assert after[-len(deferred):] == tuple(Action(3, "W", m) for m in deferred)  # after the last backward
    # the rest in the same order: the forwards and the backwards not deferred
    assert [a for a in after if a.kind in "FB"] == [a for a in before if a.kind == "F" or a.microbatch not in deferred]


def test_interleaved_schedules_defer_on_the_last_model_chunk():
    schedule = build_schedule("interleaved-1f1b", 4, 2, 8)
    moved = defer_head_weight_grads(schedule, 22)
    head = moved.num_stages - 1
    kinds = {(a.stage, a.kind) for rank in moved.actions for a in rank if a.kind in "IW"}
    assert kinds == {(head, "I"), (head, "W")}


def workload(*overrides: str):
    scenario = load_scenario(LLAMA70, list(overrides)).scenario
    return build_workload(scenario, resolve(scenario))


def names(work) -> list[str]:
    return [op.name for block in work for op in compute_ops(block.items)]


def test_the_head_stage_waits_only_with_its_logits_weight_gradient():
    plain, deferred = workload().stages[-1], workload("training.defer_embedding_wgrad=true").stages[-1]
    assert names(deferred.backward) == names(plain.backward)  # a backward not deferred runs whole
    light = names(deferred.backward_input)
    assert "head.logits.wgrad" not in light
    assert sorted(light + ["head.logits.wgrad"]) == sorted(names(plain.backward))
    assert names(deferred.backward_weight) == ["head.logits.wgrad"]
    # under sequence parallelism the weight pass gathers the GEMM's input again
    assert [op.collective for block in deferred.backward_weight for op in block.items
            if getattr(op, "kind", "") == "collective"] == ["all-gather"]
    # what waits: the logits' gradient (8,192 tokens x 129,024 / 8 vocabulary, bf16) and the
    # GEMM's input as it arrives (1/8 of the tokens under sequence parallelism)
    assert deferred.weight_grad_buffer_bytes == (8192 * 129024 // 8 + 8192 // 8 * 8192) * 2
    assert workload("training.defer_embedding_wgrad=true").stages[0].backward_weight == \
        workload().stages[0].backward_weight  # the other stages keep their passes


def step(*overrides: str):
    return simulate(load_scenario(LLAMA70, list(overrides)).scenario)


def test_the_drain_shortens_the_step_and_the_buffer_costs_memory_on_the_head_rank():
    plain = step()
    limits = (1, 8, 0)
    runs = {limit: step("training.defer_embedding_wgrad=true", f"training.wgrad_deferral_limit={limit}")
            for limit in limits}
    buffer = runs[0].workload.stages[-1].weight_grad_buffer_bytes
    head_rank = plain.schedule.stage_to_rank[-1]
    base_peak = summarize(plain).memory[head_rank].activations_peak_bytes
    times = [runs[limit].timeline.step_time_s for limit in limits]
    # the head rank sets the pipeline's pace; each deferred GEMM leaves it for the drain, where
    # that rank waits for the others anyway
    assert plain.timeline.step_time_s > times[0] > times[1] > times[2]
    # the head rank holds one microbatch's activations at a time (the last stage of 1F1B): its
    # peak is at a forward, beside the buffers of the microbatches deferred before it, so with
    # all 16 deferred the last forward sees 15 (the 16th buffer replaces that microbatch's
    # activations, which are larger)
    for limit, deferred in zip(limits, (1, 8, 15)):
        peak = summarize(runs[limit]).memory[head_rank].activations_peak_bytes
        assert peak == pytest.approx(base_peak + deferred * buffer, rel=1e-9)


@pytest.mark.parametrize("overrides, problem", [
    (("parallel.pp=1", "parallel.dp=4"), "parallel.pp > 1"),
    (("parallel.schedule=zb-h1",), "1F1B and interleaved"),
    (("parallel.zero_stage=2",), "ZeRO-2"),
])
def test_layouts_megatron_does_not_defer_in_are_refused(overrides, problem):
    scenario = load_scenario(LLAMA70, ["training.defer_embedding_wgrad=true", *overrides]).scenario
    with pytest.raises(InputError) as caught:
        resolve(scenario)
    assert caught.value.field == "training.defer_embedding_wgrad" and problem in caught.value.message


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_every_evaluator_times_the_deferred_schedule_alike(schedule, vpp):
    scenario = load_scenario(LLAMA70, ["training.defer_embedding_wgrad=true", "training.wgrad_deferral_limit=5",
                                       f"parallel.schedule={schedule}", f"parallel.vpp={vpp}"]).scenario
    engine = simulate(scenario, engine=run_engine)
    assert simulate(scenario).timeline.step_time_s == pytest.approx(engine.timeline.step_time_s, rel=1e-9)
    if supports(engine.engine_input):
        assert simulate_fast(engine.engine_input).step_time_s == pytest.approx(engine.timeline.step_time_s,
                                                                               rel=1e-9)


def test_the_planner_ranks_layouts_with_the_deferral_as_a_run_prices_them():
    # the planner's fast evaluators, its exhaustive SimPy check and a plain run agree on the
    # winner's step with the deferral on; and its schedules are not shared with a plan without it
    from mpsim.explore.planbase import base_scenario
    from mpsim.explore.planner import plan
    from mpsim.explore.planreport import ranked

    def best(defer: bool, engine: str):
        scenario = base_scenario("llama3-70b", "dgx-h100", 32, 16, None,
                                 [f"training.defer_embedding_wgrad={str(defer).lower()}"])
        result = plan(scenario, top=1, pinned=["training.defer_embedding_wgrad"], engine=engine, workers=1,
                      schedules=("1f1b", "interleaved-1f1b"), progress=False)
        winner = ranked(result)[0]
        return scenario, winner["point"], winner["metrics"]["step_time_s"]

    scenario, point, fast_s = best(True, "fast")
    assert best(True, "simpy")[1:] == (point, pytest.approx(fast_s, rel=1e-9))
    fields = [f"{name}={'null' if value is None else str(value).lower()}" for name, value in point.items()]
    dp = 32 // (point["parallel.tp"] * point["parallel.pp"] * point["parallel.cp"])
    run = simulate(load_scenario(LLAMA70, [*fields, f"parallel.dp={dp}", "training.defer_embedding_wgrad=true",
                                           "training.attention=flash", "training.dtype=bf16"]).scenario)
    assert run.timeline.step_time_s == pytest.approx(fast_s, rel=1e-9)
    plain_point, plain_s = best(False, "fast")[1:]
    assert plain_point == point and plain_s > fast_s  # the same winner, without the drain's saving
