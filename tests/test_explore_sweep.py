"""Sweeps: invalid points counted, failures recorded, results appended and resumed, stable keys, order."""

from __future__ import annotations

import hashlib
import json

import pytest

from mpsim.errors import InputError
from mpsim.explore import evaluate
from mpsim.explore.pools import Session
from mpsim.explore.runner import run_points
from mpsim.explore.store import KEY_HEX_CHARS, RECORD_VERSION, KeyMaker, ResultsFile, canonical_json, stable_key
from mpsim.explore.sweep import format_sweep, run_sweep
from tests.conftest import SCENARIOS

SCENARIO = str(SCENARIOS / "llama3_70b_32xh100.yaml")  # TP 8, PP 4 on 32 H100, 16 sequences
# six points: tp=3 breaks the head count, pp=8 needs 64 devices; the rest simulate
GRID = ["parallel.tp=8,3", "parallel.pp=1,2,4"]
ZIP = ["parallel.pp=2,4,8", "parallel.microbatch_size=1,2,1"]


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_invalid_combinations_are_skipped_and_counted(tmp_path):
    result = run_sweep(SCENARIO, GRID, workers=1, out=str(tmp_path / "r.jsonl"))
    statuses = [r["status"] for r in result.report.records]
    assert statuses == ["ok", "ok", "ok", "invalid", "invalid", "invalid"]
    assert result.report.count("invalid") == 3
    invalid = result.report.records[3]
    assert invalid["point"] == {"parallel.tp": 3, "parallel.pp": 1}
    assert "parallel.tp" in invalid["error"] and "num_attention_heads" in invalid["error"]
    text = format_sweep(result)
    assert "3 invalid (skipped)" in text and "3 simulated" in text


def test_a_misspelled_field_stops_the_sweep_before_any_point(tmp_path):
    # a value a point cannot take is that point's "invalid" (above); a field the scenario has
    # not is a typo in the sweep: one error naming --sweep, and nothing is written
    out = tmp_path / "r.jsonl"
    with pytest.raises(InputError, match="unknown field; did you mean 'tp'") as caught:
        run_sweep(SCENARIO, ["parallel.tpp=1,2"], workers=1, out=str(out))
    assert str(caught.value).startswith("--sweep parallel.tpp:") and not out.exists()


def test_zipped_points_and_their_records(tmp_path):
    result = run_sweep(SCENARIO, (), ZIP, workers=1)
    points = [r["point"] for r in result.report.records]
    assert points == [{"parallel.pp": 2, "parallel.microbatch_size": 1}, {"parallel.pp": 4, "parallel.microbatch_size": 2},
                      {"parallel.pp": 8, "parallel.microbatch_size": 1}]
    ok = [r for r in result.report.records if r["status"] == "ok"]
    assert [r["metrics"]["pp"] for r in ok] == [2, 4]
    assert [r["metrics"]["microbatch_size"] for r in ok] == [1, 2]


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = evaluate.simulate_scenario

    def flaky(scenario, *args, **kwargs):
        if scenario.parallel.pp == 2:
            raise ZeroDivisionError("boom")
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(evaluate, "simulate_scenario", flaky)
    out = tmp_path / "r.jsonl"
    result = run_sweep(SCENARIO, ["parallel.pp=1,2,4"], workers=1, out=str(out))
    assert [r["status"] for r in result.report.records] == ["ok", "error", "ok"]
    assert result.report.records[1]["error"] == "ZeroDivisionError: boom"
    assert [r["status"] for r in lines(out)] == ["ok", "error", "ok"]
    # failed points are kept on a rerun, and recomputed with retry_failed
    monkeypatch.setattr(evaluate, "simulate_scenario", real)
    again = run_sweep(SCENARIO, ["parallel.pp=1,2,4"], workers=1, out=str(out))
    assert again.report.computed == 0 and again.report.records[1]["status"] == "error"
    retried = run_sweep(SCENARIO, ["parallel.pp=1,2,4"], workers=1, out=str(out), retry_failed=True)
    assert retried.report.computed == 1 and retried.report.records[1]["status"] == "ok"


def test_interrupted_sweep_resumes_with_only_the_missing_points(tmp_path):
    out = tmp_path / "r.jsonl"
    first = run_sweep(SCENARIO, GRID, workers=1, out=str(out), limit=3)
    assert first.report.computed == 3 and first.report.stopped
    assert len(lines(out)) == 3
    assert "3 not computed yet" in format_sweep(first)
    rest = run_sweep(SCENARIO, GRID, workers=1, out=str(out))
    assert (rest.report.computed, rest.report.reused) == (3, 3)
    assert len(lines(out)) == 6 and len({r["key"] for r in lines(out)}) == 6
    whole = run_sweep(SCENARIO, GRID, workers=1)
    assert [(r["key"], r["status"], r["metrics"]) for r in rest.report.records] == \
        [(r["key"], r["status"], r["metrics"]) for r in whole.report.records]
    # a third run computes nothing
    assert run_sweep(SCENARIO, GRID, workers=1, out=str(out)).report.computed == 0


def test_a_limit_spans_several_chunks_and_workers(tmp_path):
    out = tmp_path / "r.jsonl"
    first = run_sweep(SCENARIO, GRID, workers=2, out=str(out), limit=5)
    assert first.report.computed == 5 and first.report.stopped
    assert sum(r is not None for r in first.report.records) == 5
    rest = run_sweep(SCENARIO, GRID, workers=2, out=str(out))
    assert (rest.report.computed, rest.report.reused, rest.report.stopped) == (1, 5, False)


def test_a_stop_callback_leaves_the_rest_for_later(tmp_path):
    out = tmp_path / "r.jsonl"
    stopped = run_sweep(SCENARIO, GRID, workers=1, out=str(out), should_stop=lambda computed: computed >= 2)
    assert stopped.report.computed == 2 and stopped.report.stopped
    resumed = run_sweep(SCENARIO, GRID, workers=1, out=str(out))
    assert (resumed.report.computed, resumed.report.reused) == (4, 2)


def test_a_line_cut_short_is_ignored_and_recomputed(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(SCENARIO, GRID, workers=1, out=str(out), limit=2)
    text = out.read_text()
    out.write_text(text + text.splitlines()[0][:40])  # a crash in the middle of a write
    assert len(ResultsFile(out).load()) == 2
    resumed = run_sweep(SCENARIO, GRID, workers=1, out=str(out))
    assert resumed.report.computed == 4
    parsed, broken = [], []
    for line in out.read_text().splitlines():
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            broken.append(line)
    assert len(broken) == 1 and len(parsed) == 6  # the cut line stands alone; the appends start afresh
    assert len({r["key"] for r in parsed}) == 6


def test_keys_follow_the_resolved_point_and_the_base(tmp_path):
    a = run_sweep(SCENARIO, ["parallel.pp=2^1..2"], workers=1).report.records
    b = run_sweep(SCENARIO, ["parallel.pp=2,4"], workers=1).report.records
    assert [r["key"] for r in a] == [r["key"] for r in b]  # same resolved values, same keys
    c = run_sweep(SCENARIO, ["parallel.pp=2,4"], ["training.attention=unfused"], workers=1).report.records
    assert not {r["key"] for r in a} & {r["key"] for r in c}
    edited = tmp_path / "edited.yaml"
    edited.write_text((SCENARIOS / "llama3_70b_32xh100.yaml").read_text() + "\n# edited\n")
    d = run_sweep(str(edited), ["parallel.pp=2,4"], workers=1).report.records
    assert not {r["key"] for r in a} & {r["key"] for r in d}


def test_parallel_run_writes_the_same_file_as_a_serial_one(tmp_path):
    serial, pooled = tmp_path / "serial.jsonl", tmp_path / "pooled.jsonl"
    run_sweep(SCENARIO, GRID, workers=1, out=str(serial))
    report = run_sweep(SCENARIO, GRID, workers=2, out=str(pooled)).report
    assert report.workers == 2
    assert serial.read_bytes() == pooled.read_bytes()


class _Picky:
    """An evaluator that fails on one point in a way no evaluator should (the runner must cope)."""

    identity = "picky"

    def evaluate(self, point):
        if dict(point)["x"] == 2:
            raise KeyError("x")
        return {"status": "ok", "error": None, "metrics": {"y": dict(point)["x"] ** 2}}


def test_runner_records_an_exception_from_any_evaluator():
    with Session(workers=1) as session:
        report = run_points(_Picky(), [(("x", i),) for i in range(4)], session)
    assert [r["status"] for r in report.records] == ["ok", "ok", "error", "ok"]
    assert report.records[2]["error"] == "KeyError: 'x'"
    assert report.records[3]["metrics"] == {"y": 9}


@pytest.mark.parametrize("workers", [1, 2])
def test_runner_keeps_point_order(workers):
    with Session(workers=workers) as session:
        report = run_points(_Picky(), [(("x", i),) for i in range(9)], session)
    assert [r["point"]["x"] for r in report.records] == list(range(9))


@pytest.mark.parametrize("identity", ["3f2a9c", {"scenario": "x.yaml", "digest": "ab", "sets": ["a=1", "b=2"]}, None])
def test_keys_are_the_hash_of_the_whole_record_identity(identity):
    # the key maker splices each point between a fixed head and tail; the text must be the
    # canonical JSON of the whole object, so keys of results files written before stay valid
    point = (("parallel.tp", 4), ("parallel.layers_per_stage", [3, 5]), ("parallel.recompute", "none"),
             ("training.dtype", "bf16"), ("parallel.pp", 2), ("parallel.vpp", None), ("x", 0.5), ("y", True))
    whole = canonical_json({"v": RECORD_VERSION, "base": identity, "point": sorted([k, v] for k, v in point)})
    assert stable_key(identity, point) == hashlib.sha256(whole.encode()).hexdigest()[:KEY_HEX_CHARS]
    assert KeyMaker(identity)(reversed(point)) == stable_key(identity, point)
