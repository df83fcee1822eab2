"""Start the measurement workers, wait for them, and collect what they wrote.

The parent never imports torch. It checks that the machine is quiet, writes the job as
JSON into a scratch folder, starts one ``python -m mpsim.calibrate.measure.worker`` process per
rank with the environment of :func:`mpsim.calibrate.measure.machine.worker_environment` (the
allocator settings only take effect in a fresh process) and a rendezvous address on
loopback, and waits. A worker that fails or a job that outlives its deadline is
stopped (only the processes started here, by their own handles) and reported in one
line with the end of the worker's log.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpsim.calibrate.measure.machine import FOREIGN_CPU_LIMIT, machine_busy_share
from mpsim.paths import PACKAGE_DIR


class JobError(RuntimeError):
    """The measurement job failed (a worker crashed or timed out); the message is one line."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_quiet(limit: float = FOREIGN_CPU_LIMIT, max_wait_s: float = 60.0, window_s: float = 1.0,
                     say=None) -> float | None:
    """Sample the machine until other processes use at most ``limit`` of it, or ``max_wait_s`` passes.

    Returns the last busy share seen (None where ``/proc/stat`` is missing).
    """
    deadline = time.monotonic() + max_wait_s
    share = machine_busy_share(window_s)
    told = False
    while share is not None and share > limit and time.monotonic() < deadline:
        if say is not None and not told:
            say(f"machine busy: other processes use {100 * share:.0f} % of the CPU; waiting up to "
                f"{max_wait_s:.0f} s for it to drop below {100 * limit:.0f} %")
            told = True
        share = machine_busy_share(window_s)
    return share


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def run_job(job: dict, world: int, threads: int, timeout_s: float, keep: bool = False, progress=None) -> list[dict]:
    """Run ``job`` on ``world`` worker processes; their results in rank order.

    ``progress``, when given, gets each line the workers report on their phases
    (``mpsim/calibrate/measure/progress.py``), prefixed with the time since the start.
    """
    from mpsim.calibrate.measure.machine import worker_environment
    from mpsim.calibrate.measure.progress import ProgressReader
    from mpsim.explore.progress import format_duration

    folder = Path(tempfile.mkdtemp(prefix="mpsim-calibrate-"))
    job = {**job, "folder": str(folder), "world": world, "threads": threads}
    job_file = folder / "job.json"
    job_file.write_text(json.dumps(job))
    env = dict(os.environ)
    env.update(worker_environment(threads))
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    # the workers import this very copy of mpsim
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    workers, logs = [], []
    for rank in range(world):
        log_path = folder / f"rank{rank}.log"
        log = open(log_path, "w")
        logs.append((log, log_path))
        workers.append(subprocess.Popen([sys.executable, "-m", "mpsim.calibrate.measure.worker", str(job_file), str(rank)],
                                        env=env, stdout=log, stderr=subprocess.STDOUT))
    started = time.monotonic()
    deadline = started + timeout_s
    reader = ProgressReader(folder)

    def report() -> None:
        for line in reader.new_lines() if progress is not None else ():
            progress(f"[{format_duration(time.monotonic() - started)}] {line}")

    try:
        while any(w.poll() is None for w in workers):
            report()
            if time.monotonic() > deadline:
                raise JobError(f"the measurement job ran past {timeout_s:.0f} s and was stopped "
                               f"(worker logs in {folder})")
            if any(w.returncode not in (None, 0) for w in workers):
                time.sleep(2.0)  # let the others notice and write their reports
                break
            time.sleep(0.2)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for log, _ in logs:
            log.close()
        report()
    results = []
    for rank in range(world):
        path = folder / f"rank{rank}.json"
        if not path.is_file():
            raise JobError(f"rank {rank} wrote no result (exit code {workers[rank].returncode}): "
                           f"{_tail(logs[rank][1])}")
        data = json.loads(path.read_text())
        if "error" in data:
            raise JobError(f"rank {rank} failed: {data['error']}")
        results.append(data)
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return results
