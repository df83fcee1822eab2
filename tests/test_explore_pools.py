"""Workers evaluate points at a slower collector pace and always give the process's pace back;
they fork only where no runtime's threads would be copied mid-lock, and die with the command;
a stop that arrives while the pool's library runs is taken when it has returned."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types

import pytest

from mpsim.explore.pools import (FORK_UNSAFE_MODULES, YOUNG_COLLECTION_ALLOCATIONS, Session, _stops_deferred,
                                 evaluate_chunk, fewer_collections, process_context)
from mpsim.paths import display_path
from tests.conftest import ROOT, SCENARIOS, child_processes


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


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_workers_fork_unless_a_runtime_that_keeps_threads_is_loaded(monkeypatch):
    for name in FORK_UNSAFE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert process_context().get_start_method() == "fork"
    monkeypatch.setitem(sys.modules, "grpc", types.ModuleType("grpc"))
    assert process_context().get_start_method() == "forkserver"
    assert process_context("spawn").get_start_method() == "spawn"


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        children = child_processes(todo.pop())
        found.update(children)
        todo.extend(children)
    return found


def _running(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended; only its parent has not read its status)."""
    running = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except OSError:
            continue
    return running


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_from_a_fork_server_give_the_same_records_and_die_with_a_killed_command(tmp_path):
    out = tmp_path / "results.jsonl"
    # the command as a process with Ray loaded would run it: workers from a fork server
    code = ("import sys, types; sys.modules['grpc'] = types.ModuleType('grpc'); "
            "from mpsim.cli.main import main; sys.exit(main(sys.argv[1:]))")
    sweep = ["sweep", str(SCENARIOS / "megatron_22b_8xa100.yaml"), "--sweep", "parallel.global_batch_size=4..480:4",
             "--engine", "simpy", "--workers", "2", "--no-progress"]
    process = subprocess.Popen([sys.executable, "-c", code, *sweep, "--out", str(out)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while (not out.exists() or out.stat().st_size == 0) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    workers = _descendants(process.pid)
    assert len(workers) >= 3  # the fork server and two workers
    saved = out.read_text().splitlines()
    process.kill()
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _running(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(workers) == []
    # the records they wrote are those a forked pool writes for the same points
    forked = tmp_path / "forked.jsonl"
    subprocess.run([sys.executable, "-m", "mpsim", *sweep, "--limit", str(len(saved)), "--out", str(forked)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    assert forked.read_text().splitlines()[:len(saved)] == saved


def test_a_file_is_named_even_where_the_working_folder_was_removed(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    before = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        assert display_path(SCENARIOS / "megatron_22b_8xa100.yaml") == "scenarios/megatron_22b_8xa100.yaml"
    finally:
        os.chdir(before)


def _noting(calls):
    return lambda signum, frame: calls.append(signum)


def test_a_stop_during_the_pools_calls_is_taken_once_they_return():
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, _noting(calls))
    try:
        with _stops_deferred() as noted:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs between bytecodes: give it many
            assert calls == [] and noted == [signal.SIGTERM]
        assert calls == [signal.SIGTERM]  # the handler in place, once, on leaving
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert calls == [signal.SIGTERM, signal.SIGTERM]  # and in place again afterwards
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_ignored_signal_stays_ignored_and_other_threads_are_left_alone():
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with _stops_deferred():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
    seen = []

    def off_the_main_thread():
        with _stops_deferred() as noted:
            seen.append((signal.getsignal(signal.SIGINT), noted))

    thread = threading.Thread(target=off_the_main_thread)
    thread.start()
    thread.join()
    assert seen == [(signal.getsignal(signal.SIGINT), [])]


class _SigtermProbe:
    identity = "sigterm probe"

    def evaluate(self, point):
        return {"status": "ok", "metrics": {"ends": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}}


def test_a_worker_started_while_stops_are_noted_still_ends_on_sigterm():
    before = signal.signal(signal.SIGTERM, _noting([]))  # a handler of its own, as the command line has
    try:
        with Session(workers=2) as session:
            pool = session.open(points=2)
            # the first submit forks the workers, inside the pool's own deferral of stops
            pending = [pool.submit(_SigtermProbe(), [(index, ())]) for index in range(4)]
            results = []
            while pending:
                for token, records in pool.wait(pending):
                    pending.remove(token)
                    results += [body["metrics"]["ends"] for _, body in records]
    finally:
        signal.signal(signal.SIGTERM, before)
    assert results == [True] * 4
