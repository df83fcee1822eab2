"""The machine a measurement ran on: what it is, how busy it was, and the workers' environment.

Timings on a small shared machine are only as good as the quiet they were taken in: on
two cores one busy neighbour process roughly doubles a rank's step time. Two gauges:

* ``os.getloadavg()``: the kernel's 1-minute average of runnable processes. Cheap and
  familiar, but slow to react and it counts our own workers.
* ``/proc/stat``: CPU time the whole machine spent busy (and, in a virtual machine, the
  time the hypervisor stole). Subtracting the CPU time our own processes used over the
  same interval leaves the *foreign* CPU share: what other processes took. That is the
  number a run is judged by.

Everything here is plain Python (no torch), so the parent process can check the
machine before it launches anything.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass

# /proc/stat counts in USER_HZ ticks
TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

# A run in which other processes took more than this share of the machine is flagged:
# on 2 cores, 15 % is a neighbour using a third of one core, enough to slow a rank by
# several percent, which is the size of the errors being measured.
FOREIGN_CPU_LIMIT = 0.15


@dataclass(frozen=True)
class CpuSample:
    """Machine-wide busy and total CPU seconds at one instant (all cores together)."""

    busy_s: float
    total_s: float
    wall_s: float


def cpu_sample() -> CpuSample | None:
    """Read ``/proc/stat`` (None where there is no such file, e.g. macOS)."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(value) for value in fields[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    total = sum(ticks[:8])
    return CpuSample((total - idle) * TICK_S, total * TICK_S, time.monotonic())


def process_cpu_s() -> float:
    """CPU seconds this process (all its threads) has used."""
    return time.process_time()


def foreign_share(before: CpuSample | None, after: CpuSample | None, own_cpu_s: float) -> float | None:
    """Share of the machine's CPU that other processes used between two samples.

    ``own_cpu_s`` is the CPU time our own processes used over the same interval. The
    result is in [0, 1]: 0.5 on two cores means one core's worth of someone else's work.
    """
    if before is None or after is None:
        return None
    total = after.total_s - before.total_s
    if total <= 0:
        return None
    foreign = (after.busy_s - before.busy_s) - own_cpu_s
    return min(1.0, max(0.0, foreign / total))


def machine_busy_share(seconds: float = 1.0) -> float | None:
    """Share of the machine that is busy over ``seconds`` (no workers of ours running)."""
    before = cpu_sample()
    own_before = process_cpu_s()
    time.sleep(seconds)
    return foreign_share(before, cpu_sample(), process_cpu_s() - own_before)


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages, where the platform has them."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def cpu_name() -> str:
    """The processor's model name."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def worker_environment(threads: int) -> dict[str, str]:
    """Environment variables for a worker process, on top of the parent's.

    Thread pools: one OpenMP / MKL thread per rank, so two ranks on two cores do not
    fight over them (``torch.set_num_threads`` is set again inside the worker).

    glibc malloc: by default a block of 128 KiB or more is its own ``mmap`` and goes back
    to the kernel on ``free``; the threshold then moves with the sizes seen, and the top
    of the heap is trimmed whenever 128 KiB are free there. A training step allocates
    and frees activations of a few MiB every action, so the default turns each action
    into fresh page faults (the kernel zeroing new pages) whose count changes from step
    to step as the thresholds move: noise of several percent on this kind of machine.
    Pinning the mmap threshold at its 32 MiB maximum keeps activations on the heap, a
    large trim threshold stops the heap from being handed back, and a top pad grows it in
    large steps, so after the warm-up step the allocator reuses memory and the kernel is
    out of the loop. These are read once when the process starts, hence the environment.
    """
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
        "MALLOC_TRIM_THRESHOLD_": str(2**30),
        "MALLOC_TOP_PAD_": str(256 * 2**20),
        # one arena per thread would spread the same memory over several heaps; two are
        # enough for the compute thread and the communication thread
        "MALLOC_ARENA_MAX": "2",
    }
