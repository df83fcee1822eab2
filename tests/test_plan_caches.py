"""The planner's caches change how often things are computed, never what: a plan with them
equals a plan that computes every layout from scratch, and a remembered collective or
placement equals a fresh one when any of its inputs changes."""

from __future__ import annotations

import pytest

from mpsim.cost import collectives
from mpsim.cost.collectives import choose_algorithm, p2p_time, remembering
from mpsim.cost.topology import _place_ranks, place_ranks
from mpsim.explore.planbase import base_scenario
from mpsim.explore.plancache import clear_caches
from mpsim.explore.planner import PlanEvaluator, plan
from mpsim.explore.runner import MAX_GROUP_CHUNK, _chunks, _grouped

# a 13B GPT on 8 A100: too big for one GPU's state, so the plan meets every kind of outcome
# (state-only and full out-of-memory, dominated recompute, bounded, simulated)
MID_MODEL = """\
name: gpt-13b
num_layers: 40
hidden_size: 5120
ffn_hidden_size: 20480
num_attention_heads: 40
vocab_size: 51200
seq_length: 2048
"""

OPTIONS = dict(top=3, max_microbatch_size=2, schedules=("1f1b", "interleaved-1f1b", "zb-h1"), workers=1,
               progress=False)


@pytest.fixture
def mid(tmp_path):
    path = tmp_path / "gpt_13b.yaml"
    path.write_text(MID_MODEL)
    return base_scenario(str(path), "dgx-a100", 8, 16)


def test_plan_records_equal_a_plan_without_caches(mid, monkeypatch):
    clear_caches()
    cached = plan(mid, **OPTIONS)
    statuses = {record["status"] for record in cached.records}
    assert {"oom", "dominated", "ok"} <= statuses
    assert {record["metrics"].get("exact") for record in cached.records if record["status"] == "oom"} == {True, False}

    evaluate = PlanEvaluator.evaluate

    def from_scratch(self, point):
        clear_caches()
        return evaluate(self, point)

    monkeypatch.setattr(PlanEvaluator, "evaluate", from_scratch)
    fresh = plan(mid, **OPTIONS)
    assert fresh.records == cached.records


def test_a_remembered_collective_is_never_another_inputs_answer(mid):
    h100 = base_scenario("gpt3-175b", "dgx-h100", 8, 16).cluster.system
    a100 = mid.cluster.system
    tp = place_ranks(list(range(8)), 8, 64)  # a TP group filling a node
    memo: dict = {}
    with remembering(memo):
        first = choose_algorithm("all-reduce", 1e8, tp, a100)
        other_system = choose_algorithm("all-reduce", 1e8, tp, h100)
        other_size = choose_algorithm("all-reduce", 3e8, tp, a100)
        again = choose_algorithm("all-reduce", 1e8, tp, a100)
    assert collectives._memo is None  # nothing is remembered outside the block
    assert len(memo) == 3 and again is first
    assert other_system == choose_algorithm("all-reduce", 1e8, tp, h100) != first
    assert other_size == choose_algorithm("all-reduce", 3e8, tp, a100) != first


def test_a_remembered_send_is_never_another_inputs_answer(mid):
    h100 = base_scenario("gpt3-175b", "dgx-h100", 8, 16).cluster.system
    a100 = mid.cluster.system
    across = place_ranks([0, 8], 8, 64)
    memo: dict = {}
    with remembering(memo):
        answers = [p2p_time(size, pair, system) for size in (1e6, 4e6) for pair in (across, True, False)
                   for system in (a100, h100)]
        again = [p2p_time(size, pair, system) for size in (1e6, 4e6) for pair in (across, True, False)
                 for system in (a100, h100)]
    assert len(memo) == 12 and again == answers
    assert answers == [p2p_time(size, pair, system) for size in (1e6, 4e6) for pair in (across, True, False)
                       for system in (a100, h100)]
    assert len(set(answers)) > 6  # the inputs matter, so a stale answer would show


def test_a_shared_placement_equals_a_fresh_one():
    ranks = [0, 8, 16, 24]
    shared = place_ranks(ranks, 8, 64)
    assert place_ranks(list(ranks), 8, 64) is shared
    assert shared == _place_ranks(list(ranks), 8, 64, None)
    assert place_ranks(ranks, 4, 64) == _place_ranks(list(ranks), 4, 64, None) != shared
    assert place_ranks(ranks, 8) == _place_ranks(list(ranks), 8, 0, None)


def test_grouped_chunks_keep_each_group_on_one_worker():
    todo = [(i, (("g", i // 10),)) for i in range(95)]
    chunks = list(_chunks(todo, 2, group=lambda point: point[0][1]))
    assert [item for chunk in chunks for item in chunk] == todo
    for chunk in chunks:
        groups = [point[0][1] for _, point in chunk]
        assert all(g not in {h for _, p in other for h in [p[0][1]]} for other in chunks if other is not chunk
                   for g in groups)
    # a group longer than the limit is split
    big = [(i, (("g", 0),)) for i in range(MAX_GROUP_CHUNK + 5)]
    assert [len(c) for c in _chunks(big, 2, group=lambda point: point[0][1])] == [MAX_GROUP_CHUNK, 5]
    # no group: the plain chunk size
    assert [len(c) for c in _chunks(todo, 2, group=lambda point: None)] == [len(c) for c in _chunks(todo, 2)]


def test_the_check_pass_groups_layouts_that_share_stage_shapes_and_schedules(mid):
    evaluator = PlanEvaluator(mid, "check")
    point = (("parallel.tp", 2), ("parallel.pp", 2), ("parallel.recompute", "full"),
             ("parallel.schedule", "1f1b"), ("parallel.zero_stage", 1), ("parallel.sequence_parallel", True))
    other = (("parallel.tp", 2), ("parallel.pp", 2), ("parallel.recompute", "none"),
             ("parallel.schedule", "zb-h1"), ("parallel.zero_stage", 0), ("parallel.sequence_parallel", False))
    # recompute, schedule, ZeRO stage and sequence parallelism vary inside a group
    assert evaluator.chunk_group(point) == evaluator.chunk_group(other)
    # another TP width alone changes the passes and the microbatch count
    assert evaluator.chunk_group(point) != evaluator.chunk_group((("parallel.tp", 4),) + point[1:])
    # tp 4 with microbatches twice as large: as many microbatches per replica, one group
    larger = (("parallel.tp", 4), ("parallel.microbatch_size", 2)) + point[1:]
    assert evaluator.chunk_group(larger) == evaluator.chunk_group(point)
    # pp 4 with one chunk per rank and pp 2 with two: as many layers per chunk, one group
    deeper = (("parallel.pp", 4),) + tuple(item for item in point if item[0] != "parallel.pp")
    chunked = point + (("parallel.vpp", 2),)
    assert evaluator.chunk_group(deeper) == evaluator.chunk_group(chunked)
    assert evaluator.chunk_group(deeper) != evaluator.chunk_group(point)
    assert PlanEvaluator(mid, "simulate").chunk_group(point) is None


def test_grouped_points_go_together_larger_groups_first():
    todo = [(i, (("g", g),)) for i, g in enumerate("abcab")] + [(5, (("g", None),)), (6, (("g", "c"),))]
    grouped = _grouped(todo, lambda point: point[0][1])
    # groups of equal size in the order they first appear; a point with no group is a group of one
    assert [i for i, _ in grouped] == [0, 3, 1, 4, 2, 6, 5]
    todo = [(i, (("g", g),)) for i, g in enumerate("abbcc c")]
    grouped = _grouped(todo, lambda point: None if point[0][1] == " " else point[0][1])
    assert [i for i, _ in grouped] == [3, 4, 6, 1, 2, 0, 5]  # c (3 points), b (2), then a and the lone point
    # no groups at all: the order stays
    assert _grouped(todo, lambda point: None) == todo


def test_plan_records_are_the_same_with_grouped_chunks(mid):
    one = plan(mid, **OPTIONS)
    two = plan(mid, **{**OPTIONS, "workers": 2})
    assert two.records == one.records


def _stage_costs_of(scenario, fields, memo=None):
    from mpsim.cost.actions import CostModel, stage_costs
    from mpsim.cost.shared_prices import sharing as sharing_prices
    from mpsim.explore.planbase import apply_fields
    from mpsim.resolve import resolve
    from mpsim.workload import build_workload

    scenario = apply_fields(scenario, fields)
    layout = resolve(scenario)
    workload = build_workload(scenario, layout)
    placement = tuple(stage % layout.pp for stage in range(len(workload.stages)))
    if memo is None:
        return stage_costs(workload, CostModel(scenario, layout), placement)
    with sharing_prices(memo):
        return stage_costs(workload, CostModel(scenario, layout), placement)


def test_shared_prices_equal_each_models_own(mid):
    # ZeRO 0 and 1, and pipelines of 2 x 1 and 1 x 2 chunks of the same layers, build equal passes
    # as distinct objects; sharing prices them once and changes no number
    layouts = [{"parallel.tp": 2, "parallel.pp": 2, "parallel.zero_stage": zero, "parallel.recompute": rc}
               for zero in (0, 1) for rc in ("none", "full")]
    layouts.append({"parallel.tp": 2, "parallel.pp": 2, "parallel.vpp": 2, "parallel.zero_stage": 1})
    layouts.append({"parallel.tp": 4, "parallel.pp": 2, "parallel.zero_stage": 3})
    memo: dict = {}
    for fields in layouts:
        assert _stage_costs_of(mid, fields, memo) == _stage_costs_of(mid, fields)
    priced = sum(len(prices) for _, prices in memo.values())
    assert priced < 4 * 3 * len(layouts)  # fewer than one price per pass kind and stage of every layout


def test_a_shared_price_is_never_another_systems_or_placements(mid):
    h100 = base_scenario("gpt3-175b", "dgx-h100", 8, 16).cluster.system
    other = mid.model_copy(update={"cluster": mid.cluster.model_copy(update={"system": h100})})
    memo: dict = {}
    fields = {"parallel.tp": 2, "parallel.pp": 2}
    _stage_costs_of(mid, fields, memo)
    assert _stage_costs_of(other, fields, memo) == _stage_costs_of(other, fields) != _stage_costs_of(mid, fields)
    # the same pass with its TP group placed across nodes: a price of its own
    from mpsim.cost.actions import CostModel
    from mpsim.cost.shared_prices import sharing as sharing_prices
    from mpsim.explore.planbase import apply_fields
    from mpsim.resolve import resolve
    from mpsim.workload import build_workload

    scenario = apply_fields(mid, fields)
    layout = resolve(scenario)
    work = build_workload(scenario, layout).stages[1].forward

    def model(across_nodes: bool) -> CostModel:
        built = CostModel(scenario, layout)
        if across_nodes:
            built.placements = {**built.placements, "tp": place_ranks([0, 8], 8, 64)}
        return built

    with sharing_prices(memo):
        near, far = model(False).price(work), model(True).price(work)
    assert far == model(True).price(work) != near
