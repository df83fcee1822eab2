"""Stopping a sweep or a plan: nothing left running, every finished point kept, a rerun resumes.

SIGINT and SIGTERM stop the command within a second with exit code 130, the points
already computed saved in the results file; SIGKILL of the command takes its pool workers
with it (they ask the kernel to kill them when their parent dies). The workers are found
by the results file's path in their command line (forked workers share it).
"""

from __future__ import annotations

import concurrent.futures._base
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS

# alone: a stop is timed to the second, which the suite's other workers would stretch (tests/conftest.py)
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"), pytest.mark.alone]


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _sweep(out: Path) -> list[str]:
    return [sys.executable, "-m", "mpsim", "sweep", str(SCENARIOS / "megatron_22b_8xa100.yaml"), "--sweep",
            "parallel.global_batch_size=4..480:4", "--engine", "simpy", "--workers", "2", "--out", str(out),
            "--no-progress"]


def _as_a_shell_starts_it() -> None:
    # a shell that starts a job in the background without job control (as CI runners do)
    # leaves SIGINT ignored, and the child would inherit that: give it the default back. A
    # child also inherits its parent's blocked signals; a user's shell starts it with none,
    # so it starts with none here too, whatever the test process has blocked
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _stopped(process: subprocess.Popen) -> int:
    """The exit code of a process that was sent a signal, or a failure that says what its signals were."""
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        try:
            with open(f"/proc/{process.pid}/status") as handle:
                masks = " ".join(line.strip() for line in handle if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
        except OSError:
            masks = "its /proc entry unreadable"
        process.kill()
        pytest.fail(f"still running 30 s after the signal ({masks}); its stderr ended: {process.stderr.read()[-400:]}")


def _start_and_wait_for_points(command: list[str], out: Path) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_as_a_shell_starts_it)
    deadline = time.monotonic() + 120
    while (not out.exists() or out.stat().st_size == 0) and time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"finished before it could be stopped: {process.stderr.read()}")
        time.sleep(0.05)
    return process


def _gone(out: Path, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while _processes_naming(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _processes_naming(str(out))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_sweep_stops_within_a_second_keeps_its_points_and_resumes(tmp_path, signum):
    out = tmp_path / "results.jsonl"
    process = _start_and_wait_for_points(_sweep(out), out)
    sent = time.monotonic()
    process.send_signal(signum)
    assert _stopped(process) == 130
    assert time.monotonic() - sent < 1.5
    assert "rerun the same command to continue" in process.stderr.read()
    assert _gone(out) == []
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    assert saved and all(record["status"] == "ok" for record in saved)
    if signum != signal.SIGINT:
        return  # both stop the same way; one rerun shows the resume
    rerun = subprocess.run(_sweep(out), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(saved)} reused from the results file" in rerun.stdout
    assert len(out.read_text().splitlines()) == 120  # every point once: nothing lost, nothing twice


# A stop that lands while concurrent.futures holds some of its futures' locks: futures.wait
# takes them one by one, and here the signal comes after the first of them, on the first wait
# for results once points are saved. Raised there, the stop left that lock held; the
# executor's thread waited for it forever, and so did the interpreter's exit.
_STOP_INSIDE_THE_LIBRARY = """
import os, signal, sys
import concurrent.futures._base as base
out = sys.argv[sys.argv.index("--out") + 1]
sent = []
def enter(self):
    for position, future in enumerate(self.futures):
        future._condition.acquire()
        if position == 0 and len(self.futures) > 1 and not sent and os.path.exists(out) and os.path.getsize(out):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
base._AcquireFutures.__enter__ = enter
from mpsim.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not hasattr(concurrent.futures._base, "_AcquireFutures"), reason="this Python waits otherwise")
def test_a_stop_inside_the_pools_library_still_ends_the_sweep(tmp_path):
    out = tmp_path / "results.jsonl"
    command = [sys.executable, "-c", _STOP_INSIDE_THE_LIBRARY, *_sweep(out)[3:]]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_as_a_shell_starts_it)
    assert _stopped(process) == 130
    assert "rerun the same command to continue" in process.stderr.read()
    assert _gone(out) == []
    saved = [json.loads(line) for line in out.read_text().splitlines()]
    assert saved and all(record["status"] == "ok" for record in saved)


def test_a_killed_sweep_leaves_no_worker_behind(tmp_path):
    out = tmp_path / "results.jsonl"
    process = _start_and_wait_for_points(_sweep(out), out)
    assert len(_processes_naming(str(out))) >= 2  # the command and its workers
    process.kill()
    process.wait(timeout=30)
    assert _gone(out) == []


def test_a_terminated_plan_stops_and_leaves_no_worker_behind(tmp_path):
    out = tmp_path / "plan.jsonl"
    command = [sys.executable, "-m", "mpsim", "plan", "gpt3-175b", "--cluster", "dgx-a100", "--devices", "1024",
               "--global-batch", "1536", "--workers", "2", "--out", str(out), "--no-progress", "--no-prune"]
    process = _start_and_wait_for_points(command, out)
    process.send_signal(signal.SIGTERM)
    assert _stopped(process) == 130
    assert _gone(out) == []
