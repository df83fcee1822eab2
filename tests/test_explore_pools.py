"""Workers evaluate points at a slower collector pace and always give the process's pace back."""

from __future__ import annotations

import gc

import pytest

from mpsim.explore.pools import YOUNG_COLLECTION_ALLOCATIONS, Session, evaluate_chunk, fewer_collections


class _Probe:
    identity = "probe"

    def evaluate(self, point):
        if dict(point).get("fail"):
            raise RuntimeError("broken point")
        return {"status": "ok", "error": None, "metrics": {"threshold": gc.get_threshold()[0]}}


@pytest.fixture
def default_pace():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_chunk_runs_at_the_slower_pace_and_restores_it(default_pace):
    out = evaluate_chunk(_Probe(), [(0, (("fail", False),)), (1, (("fail", True),))])
    assert out[0][1]["metrics"]["threshold"] == YOUNG_COLLECTION_ALLOCATIONS
    assert out[1][1]["status"] == "error"  # a broken point is recorded, the pace still restored
    assert gc.get_threshold() == (700, 10, 10)


def test_the_pace_is_never_lowered_and_nests(default_pace):
    gc.set_threshold(10 * YOUNG_COLLECTION_ALLOCATIONS, 5, 5)
    with fewer_collections():
        assert gc.get_threshold() == (10 * YOUNG_COLLECTION_ALLOCATIONS, 5, 5)
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        with fewer_collections():
            assert gc.get_threshold()[0] == YOUNG_COLLECTION_ALLOCATIONS
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_ALLOCATIONS
    assert gc.get_threshold() == (700, 10, 10)


def test_a_serial_session_restores_the_pace_when_it_closes(default_pace):
    with pytest.raises(KeyError):
        with Session(workers=1) as session:
            pool = session.open(10)
            assert gc.get_threshold()[0] == YOUNG_COLLECTION_ALLOCATIONS
            [(_, results)] = pool.wait([pool.submit(_Probe(), [(0, ())])])
            assert results[0][1]["metrics"]["threshold"] == YOUNG_COLLECTION_ALLOCATIONS
            raise KeyError("interrupted")
    assert gc.get_threshold() == (700, 10, 10)


def test_records_without_a_results_file_carry_the_same_keys(tmp_path):
    from mpsim.explore.runner import RunControl, run_points
    from mpsim.explore.store import stable_key

    points = [(("x", i),) for i in range(5)]
    with Session(workers=1) as session:
        lazy = run_points(_Probe(), points, session, RunControl(progress=False))
        stored = run_points(_Probe(), points, session, RunControl(out=str(tmp_path / "r.jsonl"), progress=False))
    assert [r["key"] for r in lazy.records] == [stable_key("probe", p) for p in points]
    assert [r["key"] for r in stored.records] == [r["key"] for r in lazy.records]
