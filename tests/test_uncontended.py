"""Contention that changes nothing is left to the longest path, and its answer is the SimPy engine's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import EngineInput, rank_spans, simulate
from mpsim.engine.compiled import simulate_compiled
from mpsim.engine.core import TransferSpec
from mpsim.engine.uncontended import links_never_shared, simulate_uncontended
from mpsim.schedules import build_schedule
from mpsim.simulate import simulate as simulate_scenario
from mpsim.specs import load_scenario
from tests.test_engine_longest_path import close, engine_inputs

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@st.composite
def contended_inputs(draw, base=None, scales=(1.0, 0.05)):
    """Random inputs (``base``'s, by default ``engine_inputs``') whose sends load the sender's
    "out" and the receiver's "in" link, whose DP reductions load their rank's links or none,
    with transfers scaled by one of ``scales`` (long, short: often alone)."""
    inp = draw(base if base is not None else engine_inputs())
    rank_of = inp.schedule.stage_to_rank
    scale = draw(st.sampled_from(scales))
    transfer_s = {key: seconds * scale for key, seconds in inp.transfer_s.items()}
    latency_share = draw(st.floats(0, 1))
    links = {}
    for (a, b), seconds in transfer_s.items():
        if rank_of[a] != rank_of[b]:
            latency = seconds * latency_share
            links[(a, b)] = TransferSpec(latency, seconds - latency, (("out", rank_of[a]), ("in", rank_of[b])))
    shared = draw(st.booleans())

    def nic(stage: int) -> tuple:
        return (("out", rank_of[stage]), ("in", rank_of[stage])) if shared else ()

    buckets = {stage: tuple(b._replace(label=f"b{stage}.{i}", links=nic(stage)) for i, b in enumerate(bs))
               for stage, bs in inp.grad_buckets.items()}
    per_action = {key: tuple(b._replace(links=nic(key[0])) for b in bs) for key, bs in inp.action_buckets.items()}
    return replace(inp, transfer_s=transfer_s, transfer_links=links, grad_buckets=buckets, action_buckets=per_action)


def assert_same_run(mine, engine) -> None:
    assert close(mine.step_time_s, engine.step_time_s)
    assert all(close(a, b) for a, b in zip(mine.rank_end_s, engine.rank_end_s, strict=True))
    for ours, theirs in zip(mine.actions, engine.actions, strict=True):
        assert [r.action for r in ours] == [r.action for r in theirs]
        for a, b in zip(ours, theirs):
            assert close(a.ready_s, b.ready_s) and close(a.start_s, b.start_s) and close(a.end_s, b.end_s)
    transfers = sorted((t.src_rank, t.dst_rank, t.action, t.start_s, t.end_s) for t in engine.transfers)
    assert len(mine.transfers) == len(transfers)
    for a, b in zip(sorted((t.src_rank, t.dst_rank, t.action, t.start_s, t.end_s) for t in mine.transfers),
                    transfers):
        assert a[:3] == b[:3] and close(a[3], b[3]) and close(a[4], b[4])
    syncs = sorted((s.rank, s.kind, s.start_s, s.end_s) for s in engine.syncs)
    assert len(mine.syncs) == len(syncs)
    for a, b in zip(sorted((s.rank, s.kind, s.start_s, s.end_s) for s in mine.syncs), syncs):
        assert a[:2] == b[:2] and close(a[2], b[2]) and close(a[3], b[3])
    assert len(mine.send_waits) == len(engine.send_waits)


@settings(max_examples=300, deadline=None)
@given(contended_inputs())
def test_where_no_link_carries_two_flows_the_longest_path_is_the_contended_run(inp: EngineInput):
    plain = simulate_compiled(replace(inp, transfer_links=None))
    engine = simulate(inp)
    if links_never_shared(inp, plain):
        assert_same_run(plain, engine)
    assert_same_run(simulate_uncontended(inp), engine)


def test_a_link_that_carries_two_flows_goes_to_the_engine():
    """Rank 0 sends its first two forwards' activations over one link while the first is still on
    the wire: with contention they share it, which only the engine models."""
    schedule = build_schedule("1f1b", 2, 1, 4, timer=rank_spans)
    action_s = {(s, k): 1.0 for s in range(2) for k in ("F", "B")}
    transfer_s = {(0, 1): 3.0, (1, 0): 0.5}
    links = {(0, 1): TransferSpec(0.0, 3.0, (("out", 0), ("in", 1))),
             (1, 0): TransferSpec(0.0, 0.5, (("out", 1), ("in", 0)))}
    inp = EngineInput(schedule, action_s, transfer_s, transfer_links=links)
    plain = simulate_compiled(replace(inp, transfer_links=None))
    assert not links_never_shared(inp, plain)
    engine = simulate(inp)
    assert engine.step_time_s != plain.step_time_s  # sharing the link changed the step
    assert_same_run(simulate_uncontended(inp), engine)


@pytest.mark.parametrize("name, alone", [("megatron_22b_8xa100", True), ("llama3_8b_64xh100_dp8", True),
                                         ("megatron_1t_3072xa100", False), ("gpt3_175b_64xa100", False)])
def test_shipped_scenarios_go_where_their_links_say(name, alone):
    """Megatron 22B (one node) and Llama 3 8B (DP reductions after the last send) never put two
    flows on a link: the longest path answers. Megatron 1T reduces gradients over the NICs its
    pipeline sends use, at the same time; GPT-3 175B's ranks wait for their last sends with
    blocking sends: the engine answers those. Either way the answer is the engine's."""
    scenario = load_scenario(SCENARIOS / f"{name}.yaml").scenario
    assert scenario.training.network_contention
    result = simulate_scenario(scenario)
    inp = result.engine_input
    assert inp.transfer_links is not None
    plain = simulate_compiled(replace(inp, transfer_links=None))
    assert links_never_shared(inp, plain) is alone
    assert_same_run(simulate_uncontended(inp), result.timeline)
