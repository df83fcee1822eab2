"""The SimPy engine with its repeated middle cut out gives the whole run's timeline."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mpsim.cli import main
from mpsim.engine import EngineInput, rank_spans, simulate
from mpsim.engine.core import TransferSpec, duration_key, simulate_sharing
from mpsim.engine.excise import cut_out, simulate_excised
from mpsim.schedules import build_schedule
from mpsim.schedules.actions import Action
from mpsim.specs import load_scenario
from tests.test_steady_state import long_inputs
from tests.test_uncontended import assert_same_run, contended_inputs

RELATIVE = 1e-9


def assert_same_to_rounding(mine, engine) -> None:
    """The runs agree in every action and transfer and, to ``RELATIVE`` of the step, in every
    time; a send wait or reduction no longer than that may be in one run and not the other (the
    short run adds the same durations to smaller times, which rounds them differently)."""
    scale = RELATIVE * max(engine.step_time_s, 1e-300)

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= scale

    assert near(mine.step_time_s, engine.step_time_s)
    assert all(near(a, b) for a, b in zip(mine.rank_end_s, engine.rank_end_s, strict=True))
    for ours, theirs in zip(mine.actions, engine.actions, strict=True):
        assert [(r.index, r.action) for r in ours] == [(r.index, r.action) for r in theirs]
        assert all(near(a.ready_s, b.ready_s) and near(a.start_s, b.start_s) and near(a.end_s, b.end_s)
                   for a, b in zip(ours, theirs))

    def key(t):
        return (t.src_rank, t.dst_rank, t.action)

    assert sorted(map(key, mine.transfers)) == sorted(map(key, engine.transfers))
    for a, b in zip(sorted(mine.transfers, key=key), sorted(engine.transfers, key=key)):
        assert near(a.start_s, b.start_s) and near(a.end_s, b.end_s)
    for ours, theirs in ([(s.rank, s.kind, s.start_s, s.end_s) for s in t.syncs if s.end_s - s.start_s > scale]
                         for t in (mine, engine)), \
            ([w for w in t.send_waits if w[2] - w[1] > scale] for t in (mine, engine)):
        assert len(ours) == len(theirs)
        for a, b in zip(sorted(ours), sorted(theirs)):
            assert a[:-2] == b[:-2] and near(a[-2], b[-2]) and near(a[-1], b[-1])


simulating = importlib.import_module("mpsim.simulate")  # the module: ``mpsim.simulate`` is also its function
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
WINDOW = 8  # microbatches walked first: small, so that short random steps still have a middle to cut


@st.composite
def long_contended_inputs(draw):
    """Long periodic steps whose sends load the sender's "out" and receiver's "in" links, with
    DP reductions on the same links or on none, short or long transfers, and sometimes
    reductions started by every backward (which keep the whole step in the engine)."""
    inp = draw(contended_inputs(long_inputs(names=("1f1b", "interleaved-1f1b", "zb-h1", "gpipe")),
                                scales=(1.0, 0.05, 0.0)))
    if draw(st.integers(0, 3)):
        inp = replace(inp, action_buckets={})
    return inp if draw(st.booleans()) else replace(inp, transfer_links=None)


@settings(max_examples=250, deadline=None)
@given(long_contended_inputs())
def test_the_short_run_put_back_is_the_whole_run(inp: EngineInput):
    assert_same_to_rounding(simulate_excised(inp, WINDOW), simulate(inp))


def _microbatches_once(schedule) -> bool:
    """Every stage runs each kind of pass once for every microbatch, and each rank only its own stages."""
    seen: dict[tuple, Counter] = {}
    for rank, items in enumerate(schedule.actions):
        for item in items:
            if schedule.stage_to_rank[item.stage] != rank:
                return False
            seen.setdefault((item.stage, item.kind), Counter())[item.microbatch] += 1
    return all(sorted(count) == list(range(schedule.num_microbatches)) and set(count.values()) == {1}
               for count in seen.values())


@settings(max_examples=60, deadline=None)
@given(long_contended_inputs())
def test_the_short_schedule_is_a_schedule(inp: EngineInput):
    cut = cut_out(inp, WINDOW)
    assume(cut is not None)
    short = cut.short(inp.schedule)
    assert short.num_microbatches == inp.schedule.num_microbatches - cut.layers * cut.shift
    assert _microbatches_once(short)
    assert sum(map(len, short.actions)) == sum(map(len, inp.schedule.actions)) - cut.layers * sum(cut.items)


def test_a_long_1f1b_is_cut_to_its_warm_up_and_cool_down():
    """1F1B on 4 stages over 64 microbatches, one second per pass: the walk repeats from its
    first steady layer, and all but a few layers are cut (one microbatch per layer, one
    forward and one backward per rank); the put-back run is the engine's."""
    schedule = build_schedule("1f1b", 4, 1, 64, timer=rank_spans)
    action_s = {(s, k): 1.0 for s in range(4) for k in ("F", "B")}
    transfer_s = {(s, s + 1): 0.25 for s in range(3)} | {(s + 1, s): 0.25 for s in range(3)}
    links = {key: TransferSpec(0.05, 0.2, (("out", key[0]), ("in", key[1]))) for key in transfer_s}
    inp = EngineInput(schedule, action_s, transfer_s, transfer_links=links, send_blocking=True)
    cut = cut_out(inp, WINDOW)
    assert cut is not None and cut.shift == 1 and set(cut.items) == {2}
    assert cut.layers >= 64 - 2 * 4 - 8  # all but the fill, the drain and a few layers around the cut
    assert cut.cycle_s == 2.5  # a forward, a backward and, sends blocking, two transfers of 0.25 s
    assert_same_run(simulate_excised(inp, WINDOW), simulate(inp))


def test_sends_that_share_a_link_in_the_middle_keep_the_whole_step():
    """Two ranks whose activations and gradients cross one half-duplex wire: without contention
    the step repeats (a cut is found), but with it each activation meets a gradient on the wire
    all through the middle, which slows the step by a fifth; the short run shares the wire
    before its cut, so the whole step runs."""
    schedule = build_schedule("1f1b", 2, 1, 40, timer=rank_spans)
    action_s = {(s, k): 1.0 for s in range(2) for k in ("F", "B")}
    transfer_s = {(0, 1): 0.5, (1, 0): 0.5}
    links = {key: TransferSpec(0.0, 0.5, (("wire",),)) for key in transfer_s}
    inp = EngineInput(schedule, action_s, transfer_s, transfer_links=links, send_blocking=True)
    cut = cut_out(inp, WINDOW)
    assert cut is not None
    short, first_shared_s = simulate_sharing(replace(inp, schedule=cut.short(schedule)))
    assert first_shared_s < short.actions[0][cut.start[0]].start_s  # shared before the cut
    excised, whole = simulate_excised(inp, WINDOW), simulate(inp)
    assert whole.step_time_s > 1.15 * simulate(replace(inp, transfer_links=None)).step_time_s
    assert excised.step_time_s == whole.step_time_s  # not put back together: the whole step ran
    assert_same_run(excised, whole)


def test_megatron_1t_at_a_large_batch_is_cut_and_exact():
    """Megatron 1T on 3,072 A100 at 512 microbatches per pipeline: its DP reductions share the
    NICs with pipeline sends in the cool-down, so the contended engine must run; the middle is
    cut (444 of 510 steady layers), and the step and every record are the engine's."""
    scenario = load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml", ["parallel.global_batch_size=3072"]).scenario
    result = simulating.simulate(scenario)
    inp = result.engine_input
    cut = cut_out(inp)
    assert cut is not None and cut.layers > 400
    whole = simulate(inp)
    assert_same_run(result.timeline, whole)
    assert abs(result.timeline.step_time_s - whole.step_time_s) <= 1e-12 * whole.step_time_s


def test_the_bubble_reference_is_the_same_with_its_middle_cut(monkeypatch):
    """The balanced reference run cuts its own repeated middle and repeats its waits; every wait
    equals the one the whole walk gives."""
    scenario = load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml", ["parallel.global_batch_size=3072"]).scenario
    result = simulating.simulate(scenario)
    cuts = []
    monkeypatch.setattr(simulating, "cut_out", lambda inp: cuts.append(cut_out(inp)) or cuts[-1])
    cut, whole = simulating.bubble_reference(result), simulating.bubble_reference(result, cut=False)
    assert len(cuts) == 1 and cuts[0] is not None and cuts[0].layers > 400
    assert [len(w) for w in cut.waits_before] == [len(w) for w in whole.waits_before]
    for ours, theirs in zip(cut.waits_before, whole.waits_before):
        assert all(abs(a - b) <= 1e-9 * max(1.0, abs(b)) for a, b in zip(ours, theirs))
    assert all(abs(a - b) <= 1e-9 for a, b in zip(cut.drain_after, whole.drain_after))


def test_overlapped_pairs_and_short_steps_are_not_cut():
    """DualPipe's overlapped pairs are left whole, and so is a step shorter than the window."""
    schedule = build_schedule("dualpipev", 4, 2, 64, timer=rank_spans)
    assert any(type(item) is not Action for items in schedule.actions for item in items)
    action_s = {}
    for items in schedule.actions:
        for item in items:
            action_s.setdefault(duration_key(item), 1.0)
    assert cut_out(EngineInput(schedule, action_s, {}), WINDOW) is None
    short = build_schedule("1f1b", 4, 1, 16, timer=rank_spans)
    assert cut_out(EngineInput(short, {(s, k): 1.0 for s in range(4) for k in "FB"}, {})) is None


def _numbers_close(ours, theirs, path="") -> None:
    """Two JSON values alike: the same keys, lists and strings; numbers to 1e-9 relative."""
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), path
        for key in ours:
            _numbers_close(ours[key], theirs[key], f"{path}/{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _numbers_close(a, b, f"{path}[{i}]")
    elif isinstance(ours, float) or isinstance(theirs, float):
        assert abs(ours - theirs) <= 1e-9 * max(abs(ours), abs(theirs), 1e-30) + 1e-12, path
    else:
        assert ours == theirs, path


def test_mpsim_run_gives_the_summary_of_every_action(capsys):
    """``mpsim run`` of a step whose middle is cut prints the summary ``--full-timeline`` prints
    from every action: bubble by cause, exposed communication, memory, per rank."""
    args = ["run", str(SCENARIOS / "megatron_1t_3072xa100.yaml"), "--set", "parallel.global_batch_size=3072", "--json"]
    summaries = []
    for extra in ([], ["--full-timeline"]):
        assert main(args + extra) == 0
        summaries.append(json.loads(capsys.readouterr().out))
    _numbers_close(*summaries)
    assert summaries[0]["ranks"] and summaries[0]["step_time_s"] > 70


def test_a_gap_within_rounding_of_the_step_is_not_idle():
    """Two sums of the same durations taken at other magnitudes differ in their last bits; such a
    gap between two actions is no wait (else a cut run and the whole one, equal to rounding,
    would draw different idle slices), while a microsecond's is one."""
    from mpsim.engine.timeline import ActionRecord, Timeline
    from mpsim.results.idle import idle_intervals

    def gaps(second_start_s: float) -> list:
        records = [ActionRecord(0, 0, Action(0, "F", 0), 0.0, 0.0, 100.0),
                   ActionRecord(0, 1, Action(0, "F", 1), 100.0, second_start_s, second_start_s + 100.0)]
        return idle_intervals(Timeline(1, actions=[records], rank_end_s=[200.0]), 0, second_start_s + 100.0)

    assert gaps(100.0 + 1e-12) == []
    assert [(g.start_s, g.end_s) for g in gaps(100.0 + 1e-6)] == [(100.0, 100.0 + 1e-6)]
