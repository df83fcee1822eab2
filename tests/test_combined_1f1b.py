"""Megatron-Core's combined 1F1B (``training.overlap_moe_expert_parallel_comm``).

Megatron-Core runs one forward more in the interleaved warm-up and then pairs each
steady-state forward with a backward of another microbatch, overlapping the expert
all-to-alls of each with the other's compute (megatron/core/pipeline_parallel/schedules.py,
``get_pp_rank_microbatches``; combined_1f1b.py). The tests hold the order to Megatron's,
the pairs to independence, the pricing to hiding the expert collectives only, and the
refusals to the ones Megatron-Core makes at start-up.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from mpsim.cli import main
from mpsim.cost.actions import ActionCost
from mpsim.cost.pairs import EXPERT_DISPATCH_GROUPS, overlapped_cost
from mpsim.errors import InputError
from mpsim.results import summarize
from mpsim.schedules import Overlapped, ScheduleError, build_schedule, flat, validate
from mpsim.schedules.generators import interleaved_1f1b
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.layout import resolve_layout
from tests.conftest import SCENARIOS

MIXTRAL = SCENARIOS / "mixtral_8x7b_64xh100.yaml"
COMBINED = "training.overlap_moe_expert_parallel_comm=true"


def _forwards_before_first_backward(actions) -> int:
    passes = flat(actions)
    first = next((i for i, action in enumerate(passes) if action.kind == "B"), len(passes))
    return sum(action.kind == "F" for action in passes[:first])


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), vpp=st.integers(2, 4), rounds=st.integers(1, 3))
def test_warmup_is_megatrons_plus_one_and_the_steady_state_runs_in_pairs(pp, vpp, rounds):
    vpp = 1 if pp == 1 else vpp
    microbatches = pp * rounds
    plain = interleaved_1f1b(pp, vpp, microbatches)
    combined = interleaved_1f1b(pp, vpp, microbatches, combined=True)
    validate(combined)  # every pass once, and the lists run to the end
    total = vpp * microbatches
    for rank in range(pp):
        warmup = (vpp - 1) * pp + 2 * (pp - 1 - rank)  # Megatron-Core's, groups of pp
        # the first backward comes after one forward more (the plain steady state runs F, then B)
        assert _forwards_before_first_backward(plain.actions[rank]) == min(warmup + 1, total)
        assert _forwards_before_first_backward(combined.actions[rank]) == min(warmup + 2, total)
        # the same passes, the forwards in the same order, the backwards in the same order
        assert Counter(flat(combined.actions[rank])) == Counter(flat(plain.actions[rank]))
        for kind in "FB":
            assert ([a for a in flat(combined.actions[rank]) if a.kind == kind]
                    == [a for a in flat(plain.actions[rank]) if a.kind == kind])
        pairs = [item for item in combined.actions[rank] if isinstance(item, Overlapped)]
        assert len(pairs) == max(0, total - min(warmup + 1, total))
        for pair in pairs:
            # independent: the backward's own forward ran before the pair
            assert (pair.backward.stage, pair.backward.microbatch) != (pair.forward.stage, pair.forward.microbatch)


def test_without_pipelining_the_first_forward_runs_alone_then_pairs():
    # combined_1f1b_schedule_for_no_pipelining: F0, (F k+1, B k) ..., the last B
    schedule = build_schedule("1f1b", 1, 1, 4, combined=True)
    assert [str(item) for item in schedule.actions[0]] == [
        "0F0", "(0F1;0B0)OVERLAP_F_B", "(0F2;0B1)OVERLAP_F_B", "(0F3;0B2)OVERLAP_F_B", "0B3"]
    assert schedule.name == "1f1b"


@pytest.mark.parametrize("name, pp, vpp, fragment", [
    ("gpipe", 2, 1, "interleaved 1F1B"),
    ("1f1b", 2, 1, "virtual stages"),
    ("zb-h1", 1, 1, "interleaved 1F1B"),
])
def test_schedules_megatron_does_not_pair_are_refused(name, pp, vpp, fragment):
    with pytest.raises(ScheduleError, match=fragment):
        build_schedule(name, pp, vpp, 4 * pp, combined=True)


def _cost(compute_s: float, **exposed_s: float) -> ActionCost:
    total = sum(exposed_s.values())
    return ActionCost(compute_s + total, compute_s, total, total, 1.0, (),
                      exposed_by_group=tuple(sorted(exposed_s.items())))


def test_a_pair_hides_the_expert_collectives_and_keeps_the_others_in_line():
    forward, backward = _cost(1.0, ep=0.3, tp=0.1), _cost(2.0, ep=0.2, etp=0.1, tp=0.1)
    pair = overlapped_cost(forward, backward, overlap=True, hides=EXPERT_DISPATCH_GROUPS)
    assert pair.compute_s == pytest.approx(3.0)
    assert pair.duration_s == pytest.approx(3.2)  # the two TP collectives stay exposed
    assert dict(pair.exposed_by_group) == pytest.approx({"ep": 0.0, "etp": 0.0, "tp": 0.2})
    # DualPipe's pairs (no group named) hide every group's
    assert overlapped_cost(forward, backward, overlap=True).duration_s == pytest.approx(3.0)
    # expert collectives longer than the pair's compute show by the excess
    long = overlapped_cost(_cost(0.5, ep=2.0), _cost(0.5, ep=2.0, tp=0.1), overlap=True,
                           hides=EXPERT_DISPATCH_GROUPS)
    assert long.duration_s == pytest.approx(4.1)


def _summary(*extra: str):
    return summarize(simulate(load_scenario(MIXTRAL, list(extra)).scenario))


def test_the_mixtral_step_hides_expert_all_to_alls_and_holds_one_microbatch_more():
    plain, combined = _summary(), _summary(COMBINED)
    assert combined.exposed_ep_comm_s < 0.5 * plain.exposed_ep_comm_s
    assert combined.exposed_tp_comm_s == pytest.approx(plain.exposed_tp_comm_s)
    assert combined.step_time_s < plain.step_time_s
    # 1F1B without pipelining holds one microbatch; the combined form a second one
    assert combined.peak_memory_bytes > plain.peak_memory_bytes
    # on a slower network the all-to-alls are longer, and hiding them gains more
    slow = "cluster.system.scale_out.nic_bandwidth=10 GB/s"
    assert (_summary(slow).step_time_s - _summary(slow, COMBINED).step_time_s
            > plain.step_time_s - combined.step_time_s)


@pytest.mark.parametrize("extra, fragment", [
    (("model=llama3-8b", "parallel.ep=1"), "mixture-of-experts"),
    (("parallel.ep=1",), "parallel.ep of 2"),
    (("parallel.recompute=full",), "recompute"),
    (("parallel.pp=2", "cluster.nodes=16"), "virtual stages"),
    (("parallel.schedule=gpipe",), "interleaved 1F1B"),
])
def test_layouts_megatron_refuses_are_refused_naming_the_field(extra, fragment):
    scenario = load_scenario(MIXTRAL, [COMBINED, *extra]).scenario
    with pytest.raises(InputError, match=fragment) as raised:
        resolve_layout(scenario)
    assert raised.value.field == "training.overlap_moe_expert_parallel_comm"


def test_the_command_line_refuses_in_one_line(capsys):
    assert main(["run", str(MIXTRAL), "--set", COMBINED, "--set", "parallel.ep=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.overlap_moe_expert_parallel_comm" in err[0]
    assert main(["schedule", "interleaved-1f1b", "--pp", "2", "--vpp", "2", "--microbatches", "4",
                 "--overlap-moe-expert-parallel-comm"]) == 0
    assert "OVERLAP_F_B" in capsys.readouterr().out
