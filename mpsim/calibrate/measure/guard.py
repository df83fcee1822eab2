"""Is the machine quiet enough to measure? Two gauges, agreed by all ranks.

* **Foreign CPU share** (``/proc/stat``): the share of the machine's CPU time that
  processes other than our workers used since :meth:`LoadGuard.start`.
* **Speed canary**: a fixed 256^3 GEMM timed before and after each measurement,
  against what it ran at when the job started. A virtual machine can be slowed
  by neighbours it cannot see (other guests on the same physical cores or memory):
  nothing shows in ``/proc/stat`` while every GEMM runs a third slower for seconds.
  The canary sees that.

A measurement is *disturbed* when either gauge is over its limit on any rank; the
caller measures again after :meth:`LoadGuard.wait_for_quiet` (all ranks pause
together, within a budget for the whole job). A job that keeps disturbed measurements
(``--allow-busy``) stops retrying once that budget is spent: the machine did not quiet
down in all that time, and a try right away would only see the same load again.
"""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from mpsim.calibrate.measure.machine import cpu_sample, process_cpu_s

MAX_TRIES = 3  # measurements of one thing under disturbance before keeping the least disturbed
SLOWDOWN_LIMIT = 1.25  # canary a quarter slower than its reference: the machine is not itself
SAY_EVERY_S = 10.0  # at most one progress line about pausing for quiet per this many seconds


class Disturbance(NamedTuple):
    """How disturbed a measurement was: other processes' CPU share and the canary's slowdown."""

    share: float
    slowdown: float

    def as_dict(self) -> dict:
        return {"foreign_cpu_share": self.share, "slowdown": self.slowdown}


class SpeedCanary:
    """A small GEMM whose time says how fast this rank's core (or GPU) runs right now.

    A core that idled clocks down and a GEMM right after a pause runs slow, so each
    sample warms up first and keeps the fastest of many runs (an interrupted run only
    makes a run slower, never faster). The reference is the median of the samples
    taken when the guard is built. Even so the canary scatters by about 10 % on a
    shared virtual machine, so only slowdowns beyond :data:`SLOWDOWN_LIMIT` count.
    """

    def __init__(self, device: torch.device, kind: str, size: int = 256):
        generator = torch.Generator().manual_seed(7)
        self.a = torch.randn(size, size, generator=generator).to(device)
        self.b = torch.randn(size, size, generator=generator).to(device)
        self.kind = kind
        self.reference_s = statistics.median(self.sample() for _ in range(7))

    def _once(self) -> float:
        if self.kind == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            torch.mm(self.a, self.b)
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1e3
        begin_s = time.perf_counter()
        torch.mm(self.a, self.b)
        return time.perf_counter() - begin_s

    def sample(self, warmup: int = 10, repeats: int = 20) -> float:
        """The fastest of ``repeats`` runs after ``warmup`` untimed ones, in seconds."""
        for _ in range(warmup):
            torch.mm(self.a, self.b)
        return min(self._once() for _ in range(repeats))

    def slowdown(self) -> float:
        """How many times slower than its reference the canary runs now."""
        return self.sample() / self.reference_s


class LoadGuard:
    """Foreign CPU share and canary slowdown over a measurement, agreed by all ranks.

    ``wait_budget_s`` is how long, over the whole job, the ranks may pause (all together)
    for a disturbed machine to settle before they measure again.
    """

    def __init__(self, device: torch.device, kind: str, limit: float, wait_budget_s: float,
                 keep_disturbed: bool = False, say=None):
        self.device = device
        self.say = say  # told when the ranks pause for quiet (the job's progress), or None
        self.said_s = -SAY_EVERY_S
        self.limit = limit
        self.wait_left_s = wait_budget_s
        self.keep_disturbed = keep_disturbed  # --allow-busy: keep the least disturbed try of anything
        self.canary = SpeedCanary(device, kind)
        self.before = None
        self.own_before = 0.0
        self.slow_before = 1.0

    def start(self) -> None:
        self.slow_before = self.canary.slowdown()
        self.before, self.own_before = cpu_sample(), process_cpu_s()

    def check(self) -> Disturbance:
        """The disturbance since :meth:`start`, the worst over ranks."""
        after, own = cpu_sample(), process_cpu_s() - self.own_before
        slow = max(self.slow_before, self.canary.slowdown())
        ours = torch.tensor([own], dtype=torch.float64, device=self.device)
        dist.all_reduce(ours)  # every rank's own CPU time
        foreign = 0.0
        if self.before is not None and after is not None and after.total_s > self.before.total_s:
            busy_s = after.busy_s - self.before.busy_s - ours.item()
            foreign = max(0.0, busy_s / (after.total_s - self.before.total_s))
        agreed = torch.tensor([foreign, slow], dtype=torch.float64, device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # one decision for all ranks
        return Disturbance(*agreed.tolist())

    def disturbed(self, disturbance: Disturbance) -> bool:
        return self.score(disturbance) > 1.0

    def score(self, disturbance: Disturbance) -> float:
        """Above 1 when a gauge is over its limit; the larger, the worse."""
        return max(disturbance.share / self.limit, (disturbance.slowdown - 1.0) / (SLOWDOWN_LIMIT - 1.0))

    def wait_for_quiet(self, window_s: float = 1.0) -> None:
        """Pause every rank until both gauges are back under their limits, or the wait budget is spent."""
        while self.wait_left_s > 0:
            self.start()
            time.sleep(window_s)
            self.wait_left_s -= window_s
            if not self.disturbed(self.check()):
                return

    def pause_to_retry(self, disturbance: Disturbance | None = None) -> bool:
        """After a disturbed try: pause for quiet, and whether to try again.

        Always, unless disturbed measurements are kept and the wait budget is spent.
        The budget is the same on every rank, so they all decide alike.
        """
        if self.keep_disturbed and self.wait_left_s <= 0:
            return False
        if self.say is not None and self.wait_left_s > 0 and time.monotonic() - self.said_s >= SAY_EVERY_S:
            self.said_s = time.monotonic()
            seen = "" if disturbance is None else (f" (other processes {100 * disturbance.share:.0f} % of the CPU, "
                                                   f"speed canary {disturbance.slowdown:.2f}x)")
            self.say(f"  machine disturbed{seen}: pausing for it to settle, then measuring again; "
                     f"{self.wait_left_s:.0f} s of pauses left in this job")
        self.wait_for_quiet()
        return True


def least_disturbed(measure, guard: LoadGuard):
    """``measure()`` until it ran undisturbed (a few tries); the least disturbed result and its disturbance."""
    best = None
    for _ in range(MAX_TRIES):
        dist.barrier()
        guard.start()
        value = measure()
        disturbance = guard.check()
        if best is None or guard.score(disturbance) < guard.score(best[1]):
            best = (value, disturbance)
        if not guard.disturbed(disturbance) or not guard.pause_to_retry(disturbance):
            break
    return best
