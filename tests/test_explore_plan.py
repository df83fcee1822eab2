"""The planner: enumeration rules, memory pruning, exact top with the bound, ranking, reasons."""

from __future__ import annotations

import pytest

from mpsim.explore.layouts import PlanContext, enumerate_layouts, layer_split
from mpsim.explore.planbase import apply_fields, base_scenario
from mpsim.explore.planner import PlanEvaluator, plan, plan_identity
from mpsim.explore.planreport import explain_losses, format_plan, matching, ranked
from mpsim.results import summarize
from mpsim.simulate import simulate
from tests.conftest import TINY_MODEL

SMALL = dict(top=5, max_microbatch_size=2, schedules=("1f1b", "interleaved-1f1b"), workers=1, progress=False)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "gpt_1_3b.yaml"
    path.write_text(TINY_MODEL)
    return base_scenario(str(path), "dgx-a100", 8, 16)


def test_layer_split_even_or_lighter_ends():
    assert layer_split(96, 8) is None
    assert layer_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert layer_split(126, 128) == (0,) + (1,) * 126 + (0,)
    assert layer_split(126, 127) == (0,) + (1,) * 126
    assert layer_split(96, 10) is False  # ten chunks of ten would leave four layers short


def test_enumeration_follows_the_framework_rules(tiny):
    layouts = list(enumerate_layouts(PlanContext(tiny, max_microbatch_size=2, schedules=("1f1b", "interleaved-1f1b"))))
    assert layouts, "a 1.3B model has layouts on 8 GPUs"
    for layout in layouts:
        tp, pp, vpp = layout["parallel.tp"], layout["parallel.pp"], layout["parallel.vpp"]
        assert 16 % tp == 0 and 8 % (tp * pp) == 0
        dp = 8 // (tp * pp)
        assert 16 % (dp * layout["parallel.microbatch_size"]) == 0
        assert (layout["parallel.schedule"] == "interleaved-1f1b") == (vpp > 1)
        assert not layout["parallel.sequence_parallel"] or tp > 1
        assert layout["parallel.zero_stage"] in (0, 1) and (layout["parallel.zero_stage"] == 0 or dp > 1)
    assert len({tuple(sorted((k, str(v)) for k, v in layout.items())) for layout in layouts}) == len(layouts)


def test_pinned_fields_are_not_enumerated(tiny):
    pinned = apply_fields(tiny, {"parallel.tp": 2, "parallel.recompute": "full"})
    layouts = list(enumerate_layouts(PlanContext(pinned, max_microbatch_size=1), ["parallel.tp", "parallel.recompute"]))
    assert {layout["parallel.tp"] for layout in layouts} == {2}
    assert {layout["parallel.recompute"] for layout in layouts} == {"full"}


@pytest.mark.parametrize("fields,expected", [
    ({}, {"none", "selective", "full"}),  # Megatron's layers: its core-attention recompute
    # plain PyTorch layers (torchtitan's kind): torchtitan's per-op policy instead, which Megatron lacks
    ({"training.transformer_impl": "pytorch", "model.linear_bias": False}, {"none", "selective-op", "full"}),
    # ... and neither where the projections have biases (addmm, which the policy does not keep)
    ({"training.transformer_impl": "pytorch"}, {"none", "full"}),
])
def test_the_plan_offers_the_recompute_modes_of_the_runs_framework(tiny, fields, expected):
    base = apply_fields(tiny, fields)
    layouts = list(enumerate_layouts(PlanContext(base, max_microbatch_size=1, schedules=("1f1b",))))
    assert {layout["parallel.recompute"] for layout in layouts} == expected


def test_memory_check_agrees_with_the_report(tiny):
    fields = {"parallel.tp": 2, "parallel.pp": 2, "parallel.vpp": 1, "parallel.layers_per_stage": None,
              "parallel.microbatch_size": 2, "parallel.sequence_parallel": True,
              "parallel.zero_stage": 1, "parallel.recompute": "none", "parallel.schedule": "1f1b"}
    evaluator = PlanEvaluator(tiny, "simulate", "fast", plan_identity(tiny))
    record = evaluator.evaluate(tuple(fields.items()))
    assert record["status"] == "ok"
    reference = summarize(simulate(apply_fields(tiny, fields)))
    assert record["metrics"]["peak_memory_bytes"] == pytest.approx(reference.peak_memory_bytes, rel=1e-12)
    assert record["metrics"]["step_time_s"] == pytest.approx(reference.step_time_s, rel=1e-9)
    assert record["metrics"]["lower_bound_s"] <= reference.step_time_s


def test_bound_pruning_keeps_the_exact_top(tiny):
    pruned = plan(tiny, **SMALL)
    everything = plan(tiny, prune=False, **SMALL)
    assert pruned.simulated < everything.simulated
    assert [r["key"] for r in ranked(pruned)[:5]] == [r["key"] for r in ranked(everything)[:5]]
    assert any(r["status"] == "bound" for r in pruned.records)


def test_known_better_layout_ranks_above_known_worse(tiny):
    # 16 sequences of a 1.3B model: data parallel over 8 GPUs has no bubble and a small gradient
    # all-reduce on NVLink; an 8-stage pipeline of 16 microbatches idles 7/23 of the time
    result = plan(tiny, prune=False, **SMALL)
    winners = ranked(result)
    position = {r["key"]: i for i, r in enumerate(winners)}

    def best(**wanted) -> int:
        return min(position[r["key"]] for _, r in matching(result, wanted) if r["key"] in position)

    assert best(tp=1, pp=1, dp=8) < best(tp=1, pp=8, dp=1)
    assert best(tp=1, pp=1, dp=8) < best(tp=8, pp=1, dp=1)  # TP collectives on a 2048-wide model do not pay
    worst_pipeline = [r for _, r in matching(result, {"tp": 1, "pp": 8, "dp": 1})]
    assert all(r["metrics"]["bubble_fraction"] > winners[0]["metrics"]["bubble_fraction"]
               for r in worst_pipeline if r["status"] == "ok")


def test_report_names_the_reasons(tiny):
    result = plan(tiny, **SMALL)
    text = format_plan(result, 5)
    assert "best 5 layouts" in text and "why the others lost" in text
    reasons = {loss.reason: loss for loss in explain_losses(result, 5)}
    assert "more recompute than needed" in reasons  # everything fits, so recompute never pays
    assert sum(loss.count for loss in reasons.values()) == len(result.points) - 5
    # a cut layout is compared with #1 in the same terms, the lower bounds', and says so
    for loss in reasons.values():
        if loss.example["status"] == "bound":
            assert "in the lower bounds:" in loss.detail and "in #1's" in loss.detail
        if loss.reason == "bubble" and loss.example["status"] == "ok":
            assert "bubble (idle, transfer waits apart)" in loss.detail


def test_report_notes_winners_that_fit_only_without_fragmentation(tiny):
    result = plan(tiny, **SMALL)
    text = format_plan(result, 5)
    assert "less than 6.6 %" not in text  # a 1.3B model on 8 A100 leaves most of the memory free
    first = ranked(result)[0]["metrics"]
    # the same plan on devices only 3 % larger than #1's peak: it fits, but with less free than
    # the least fragmentation a published run showed
    first["capacity_bytes"] = first["peak_memory_bytes"] * 1.03
    assert "note: #1 leaves less than 6.6 % of its peak free" in format_plan(result, 5)
    first["capacity_bytes"] = first["peak_memory_bytes"] * 1.07
    assert "less than 6.6 %" not in format_plan(result, 5)


def test_report_says_searched_schedules_are_the_unit_time_order(tiny):
    assert "searched for unit pass times" not in format_plan(plan(tiny, **SMALL), 5)
    result = plan(tiny, **{**SMALL, "schedules": ("1f1b", "zb-1p"), "max_microbatch_size": 1})
    shown = {record["metrics"]["schedule"] for record in ranked(result)[:5]}
    assert "zb-1p" in shown
    assert "note: zb-1p is priced here in the order searched for unit pass times" in format_plan(result, 5)


def test_a_model_too_large_for_the_cluster_reports_memory(tmp_path):
    scenario = base_scenario("gpt3-175b", "dgx-a100", 8, 8)
    result = plan(scenario, top=3, max_microbatch_size=1, schedules=("1f1b",), workers=1, progress=False)
    assert not ranked(result)
    assert {r["status"] for r in result.records} <= {"oom", "invalid"}
    assert "no layout fits in memory" in format_plan(result, 3)


def test_plan_is_the_same_with_one_worker_or_two(tiny):
    options = {**SMALL, "workers": None}
    one = plan(tiny, **{**options, "workers": 1})
    two = plan(tiny, **{**options, "workers": 2})
    assert two.workers == 2
    assert [(r["key"], r["status"], r["metrics"]) for r in one.records] == \
        [(r["key"], r["status"], r["metrics"]) for r in two.records]


def test_a_pinned_recompute_mode_is_never_dominated(tmp_path):
    # --set parallel.recompute=full pins the mode: no lighter one is enumerated, so none can
    # dominate it, and every layout that fits is checked further
    path = tmp_path / "gpt_1_3b.yaml"
    path.write_text(TINY_MODEL)
    pinned = base_scenario(str(path), "dgx-a100", 8, 16, overrides=["parallel.recompute=full"])
    result = plan(pinned, pinned=["parallel.recompute"], **SMALL)
    statuses = [r["status"] for r in result.records if r is not None]
    assert "dominated" not in statuses and "ok" in statuses
    assert all(r["point"]["parallel.recompute"] == "full" for r in result.records if r is not None)


def test_the_invalid_example_is_one_the_most_common_reason_refused(tiny):
    # DualPipeV needs at least 2 x pp microbatches: with the tiny batch many layouts are refused
    result = plan(tiny, **{**SMALL, "schedules": ("1f1b", "dualpipev")})
    invalid = {loss.reason: loss for loss in explain_losses(result, 5)}["invalid"]
    assert invalid.example["status"] == "invalid" and invalid.example["error"] in invalid.detail
    assert invalid.detail.startswith("most common (")


def test_a_plan_with_overlapping_steps_times_and_bounds_their_period(tiny):
    overlapping = tiny.model_copy(update={"training": tiny.training.model_copy(
        update={"optimizer_post_validation": True})})
    result = plan(overlapping, prune=False, **{**SMALL, "schedules": ("1f1b", "zb-h1")})
    simulated = [r for r in result.records if r is not None and r["status"] == "ok"]
    assert simulated
    for record in simulated:
        metrics = record["metrics"]
        # the bound leaves out the fill and drain the neighbouring steps may hide, and holds
        assert metrics["lower_bound_s"] <= metrics["step_time_s"] * (1 + 1e-9)
        assert metrics["cross_step_overlap_s"] >= 0


def test_expert_layouts_fold_over_tensor_parallel_ranks_as_megatron_core_allows():
    # Megatron-Core lays ep groups of etp ranks over the tp x cp x dp ranks of a stage, etp dividing tp:
    # on 16 GPUs with TP 2 (DP 8) that allows EP 16 with ETP 1, which EP within DP alone does not
    base = apply_fields(base_scenario("mixtral-8x7b", "dgx-h100", 16, 32),
                        {"parallel.tp": 2, "parallel.pp": 1, "parallel.recompute": "full"})
    base = apply_fields(base, {"model.moe.num_experts": 16})
    layouts = list(enumerate_layouts(PlanContext(base, max_microbatch_size=1, schedules=("1f1b",)),
                                     ["parallel.tp", "parallel.pp", "parallel.recompute"]))
    pairs = {(layout["parallel.ep"], layout["parallel.etp"]) for layout in layouts}
    assert (16, 1) in pairs and (8, 2) in pairs and (8, 1) in pairs
    assert (16, 2) not in pairs  # 32 expert ranks on a stage of 16
    assert all(16 % (ep * etp) == 0 and 2 % etp == 0 for ep, etp in pairs)
    # at TP 4 the planner tries expert TP 4 (Megatron-Core's default) and 1 (folded), not 2
    wide = apply_fields(base, {"parallel.tp": 4})
    context = PlanContext(wide, max_microbatch_size=1, schedules=("1f1b",))
    pinned = ["parallel.tp", "parallel.pp", "parallel.recompute"]
    tried = {layout["parallel.etp"] for layout in enumerate_layouts(context, pinned)}
    assert tried == {4, 1}


def test_a_folded_layout_is_labelled_with_its_expert_tensor_parallelism():
    from mpsim.explore.planner import layout_label

    folded = {"parallel.tp": 2, "parallel.ep": 16, "parallel.etp": 1, "parallel.pp": 1}
    assert "ep16 etp1" in layout_label(folded)
    assert "etp" not in layout_label({**folded, "parallel.etp": 2})  # the default, etp = tp
