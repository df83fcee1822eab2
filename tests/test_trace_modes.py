"""The trace's forms: gzip-compressed output, the compact trace of a large job, and when
the compact form is chosen without being asked for (docs/traces.md)."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from itertools import pairwise

import pytest

from mpsim.cli import main
from mpsim.results import trace
from mpsim.results.trace import trace_events, write_trace
from mpsim.results.trace_writer import track_names
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario
from tests.conftest import ROOT, SCENARIOS
from tests.test_trace_nesting import nesting_violations

SMALL = SCENARIOS / "llama3_70b_32xh100.yaml"  # TP 8, PP 4, 1F1B: 128 actions, a full trace by default
TINY = SCENARIOS / "wav2vec2_large_16xa100.yaml"  # PP 4, DP 4: a full trace of about 10,000 slices


@pytest.fixture(scope="module")
def tiny():
    result = simulate(load_scenario(TINY).scenario)
    return result, bubble_reference(result)


@pytest.fixture(scope="module")
def small():
    result = simulate(load_scenario(SMALL).scenario)
    return result, bubble_reference(result)


@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
def test_gzip_holds_the_same_events_as_the_plain_file(tiny, tmp_path, compact):
    result, reference = tiny
    plain, packed, again = tmp_path / "t.json", tmp_path / "t.json.gz", tmp_path / "again.json.gz"
    for path in (plain, packed, again):
        write_trace(result, str(path), reference=reference, compact=compact)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # gzip's magic number
    with gzip.open(packed, "rt", encoding="utf-8") as handle:
        unpacked = json.load(handle)
    assert unpacked == json.loads(plain.read_text())
    assert unpacked["traceEvents"] == trace_events(result, reference=reference, compact=compact)
    assert packed.stat().st_size < plain.stat().st_size / 3
    # neither the file's name nor the time it was written is in the gzip header
    assert again.read_bytes() == packed.read_bytes()


def test_compact_trace_has_whole_actions_on_one_track_per_rank_and_counters(small):
    result, reference = small
    ranks = range(result.schedule.num_ranks)
    actions = sorted(str(record.action) for records in result.timeline.actions for record in records)
    compact = trace_events(result, reference=reference, compact=True)
    slices = [e for e in compact if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} == {(rank, 0) for rank in ranks}
    assert sorted(e["name"] for e in slices if e["cat"] != "idle") == actions
    assert all(e["name"].startswith("idle: ") for e in slices if e["cat"] == "idle")
    # the full trace of the same step has op slices, which the compact one leaves out
    full_names = {e["name"] for e in trace_events(result, reference=reference) if e["ph"] == "X"}
    assert full_names - {e["name"] for e in slices}
    counters = [e for e in compact if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == set(ranks)
    for event in counters:
        assert 0 <= event["args"].get("exposed collectives %", 0) <= event["args"].get("collectives %", 100) <= 100
    assert any(event["args"].get("collectives %", 0) > 0 for event in counters)  # TP 8 runs collectives


def _integral_us(counters: list[dict], pid: int, series: str) -> float:
    """Area under one counter series of one process, in value x microseconds."""
    points = [(e["ts"], e["args"][series]) for e in counters if e["pid"] == pid and series in e["args"]]
    assert points[-1][1] == 0, f"{series} of rank {pid} does not come back to 0"
    return sum(value * (after[0] - ts) for (ts, value), after in pairwise(points))


def test_send_counters_add_up_to_the_transfers_in_flight(small):
    """The area under each rank's send counters is the time its transfers took, summed."""
    result, reference = small
    counters = [e for e in trace_events(result, reference=reference, compact=True) if e["ph"] == "C"]
    expected: dict[tuple[int, str], int] = defaultdict(int)
    for transfer in result.timeline.transfers:
        series = "activation sends" if transfer.action.kind == "F" else "gradient sends"
        expected[transfer.src_rank, series] += round(transfer.end_s * 1e6) - round(transfer.start_s * 1e6)
    assert len(expected) == 2 * (result.schedule.num_ranks - 1)  # each rank but an end sends both ways
    for (rank, series), microseconds in expected.items():
        assert _integral_us(counters, rank, series) == pytest.approx(microseconds, abs=1e-6)


@pytest.mark.parametrize("name", ["llama3_70b_32xh100.yaml", "deepseek_v3_2048xh100.yaml", "gpt3_175b_64xa100.yaml"])
def test_compact_trace_nests(name):
    """1F1B, DualPipeV with overlapped pairs, and interleaved 1F1B keep Perfetto's rule."""
    result = simulate(load_scenario(SCENARIOS / name).scenario)
    events = trace_events(result, reference=bubble_reference(result), compact=True)
    assert any(e["ph"] == "X" for e in events)
    assert nesting_violations(events) == []


def _run_trace(path, capsys, *options) -> tuple[list[dict], str]:
    capsys.readouterr()
    assert main(["run", str(TINY), "--trace", str(path), *options]) == 0
    return json.loads(path.read_text())["traceEvents"], capsys.readouterr().err


def _is_full(events: list[dict]) -> bool:
    """Slices off the compute track (pipeline sends, DP buckets) are the full form's."""
    return any(e["ph"] == "X" and e["tid"] != 0 for e in events)


def test_the_compact_form_is_chosen_past_the_limit_and_not_at_it(tmp_path, monkeypatch, capsys):
    path = tmp_path / "t.json"
    full, _ = _run_trace(path, capsys, "--trace-full")
    assert _is_full(full) and not any(e["ph"] == "C" for e in full)
    # the limit counts the full trace's slices, idle gaps not included
    slices = sum(1 for e in full if e["ph"] == "X" and e["cat"] != "idle")
    monkeypatch.setattr(trace, "FULL_TRACE_SLICE_LIMIT", slices)
    events, err = _run_trace(path, capsys)
    assert "note:" not in err and _is_full(events)
    monkeypatch.setattr(trace, "FULL_TRACE_SLICE_LIMIT", slices - 1)
    events, err = _run_trace(path, capsys)
    assert "note:" in err and "compact" in err and "--trace-full" in err
    assert not _is_full(events) and any(e["ph"] == "C" for e in events)
    events, err = _run_trace(path, capsys, "--trace-full")
    assert "note:" not in err and _is_full(events)


def test_the_documented_limit_is_the_one_in_force():
    assert f"{trace.FULL_TRACE_SLICE_LIMIT:,} slices" in (ROOT / "docs" / "traces.md").read_text()


def test_megatron_1t_on_3072_gpus_gets_the_compact_trace_at_the_shipped_limit():
    """64 ranks x 128 actions with dozens of ops each: past the limit, which the note names."""
    result = simulate(load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml").scenario)
    ops = sum(len(result.cost(record.action).segments) for records in result.timeline.actions for record in records)
    assert ops > trace.FULL_TRACE_SLICE_LIMIT
    mode, note = trace.chosen_mode(result)
    assert mode == "compact" and f"{trace.FULL_TRACE_SLICE_LIMIT:,}" in note
    assert trace.chosen_mode(result, requested="full") == ("full", None)
    # what was simulated: 64 pipeline ranks, each standing for TP 8 x DP 6 of the 3,072 GPUs
    processes = [e["args"]["name"] for e in track_names(result, {}) if e["name"] == "process_name"]
    assert len(processes) == 64 and all(name.endswith("stands for TP 8 x DP 6 = 48 GPUs)") for name in processes)


def test_compact_is_asked_for_by_option(tmp_path, capsys):
    path = tmp_path / "t.json"
    events, err = _run_trace(path, capsys, "--trace-compact")
    assert "note:" not in err and not _is_full(events) and any(e["ph"] == "C" for e in events)


@pytest.mark.parametrize("options, field", [
    (["--trace-compact"], "--trace-compact"),
    (["--trace-full"], "--trace-full"),
    (["--trace", "t.json", "--trace-compact", "--trace-full"], "--trace-full"),
])
def test_trace_options_that_contradict_or_lack_a_file_are_one_line_errors(tmp_path, monkeypatch, capsys, options,
                                                                          field):
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(TINY), *options]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and field in lines[0]
    assert not (tmp_path / "t.json").exists()
