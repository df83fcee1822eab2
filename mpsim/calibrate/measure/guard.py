"""Is the machine quiet enough to measure? Two gauges, agreed by all ranks.

* **Foreign CPU share** (``/proc/stat``): the share of the machine's CPU time that
  processes other than our workers used since :meth:`LoadGuard.start`.
* **Speed canary**: a fixed 256^3 GEMM timed before and after each measurement,
  against the fastest it has run on any rank in the job. A virtual machine can be
  slowed by neighbours it cannot see (other guests on the same physical cores or
  memory): nothing shows in ``/proc/stat`` while every GEMM runs a third slower for
  seconds. The canary sees that. The reference is the fastest time, not the time at
  the start, because a core never runs faster than it can, while it may well start
  slow: a job that began under a neighbour and measured its canary 1.8 times faster
  later had called every slowed measurement quiet. Every kept number carries its raw
  canary time, and :func:`rebase_slowdowns` restates its slowdown against the fastest
  time of the whole job once the job is over.

A measurement is *disturbed* when either gauge is over its limit on any rank; the
caller measures again after :meth:`LoadGuard.wait_for_quiet` (all ranks pause
together, within a budget for the whole job). A job that keeps disturbed measurements
(``--allow-busy``) stops retrying once that budget is spent: the machine did not quiet
down in all that time, and a try right away would only see the same load again.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.distributed as dist

from mpsim.calibrate.measure.machine import cpu_sample, process_cpu_s

MAX_TRIES = 3  # measurements of one thing under disturbance before keeping the least disturbed
SLOWDOWN_LIMIT = 1.25  # canary a quarter slower than its reference: the machine is not itself
SAY_EVERY_S = 10.0  # at most one progress line about pausing for quiet per this many seconds


class Disturbance(NamedTuple):
    """How disturbed a measurement was: other processes' CPU share and the canary's slowdown.

    ``canary_s`` is the slowest canary time around the measurement on any rank, from
    which ``slowdown`` is computed against the fastest canary time known then.
    """

    share: float
    slowdown: float
    canary_s: float

    def as_dict(self) -> dict:
        return {"foreign_cpu_share": self.share, "slowdown": self.slowdown, "canary_s": self.canary_s}


class SpeedCanary:
    """A small GEMM whose time says how fast this rank's core (or GPU) runs right now.

    A core that idled clocks down and a GEMM right after a pause runs slow, so each
    sample warms up first and keeps the fastest of many runs (an interrupted run only
    makes a run slower, never faster). The reference, ``fastest_s``, starts as the
    fastest of the samples taken when the guard is built; the guard lowers it to the
    fastest sample any rank has taken since. Even so the canary scatters by about 10 %
    on a shared virtual machine, so only slowdowns beyond :data:`SLOWDOWN_LIMIT` count.
    """

    def __init__(self, device: torch.device, kind: str, size: int = 256):
        generator = torch.Generator().manual_seed(7)
        self.a = torch.randn(size, size, generator=generator).to(device)
        self.b = torch.randn(size, size, generator=generator).to(device)
        self.kind = kind
        self.fastest_s = min(self.sample() for _ in range(7))

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
        self.canary_before_s = self.canary.fastest_s
        fastest = torch.tensor([self.canary.fastest_s], dtype=torch.float64, device=device)
        dist.all_reduce(fastest, op=dist.ReduceOp.MIN)  # one reference for all ranks
        self.canary.fastest_s = fastest.item()

    def start(self) -> None:
        self.canary_before_s = self.canary.sample()
        self.before, self.own_before = cpu_sample(), process_cpu_s()

    def check(self) -> Disturbance:
        """The disturbance since :meth:`start`, the worst over ranks.

        The canary's reference drops to the fastest sample of either end on any rank, so
        a rank that ran faster than ever before makes every slower time a slowdown.
        """
        after, own = cpu_sample(), process_cpu_s() - self.own_before
        canary_after_s = self.canary.sample()
        ours = torch.tensor([own], dtype=torch.float64, device=self.device)
        dist.all_reduce(ours)  # every rank's own CPU time
        foreign = 0.0
        if self.before is not None and after is not None and after.total_s > self.before.total_s:
            busy_s = after.busy_s - self.before.busy_s - ours.item()
            foreign = max(0.0, busy_s / (after.total_s - self.before.total_s))
        # the minimum rides along negated, so one MAX all-reduce agrees on all three
        agreed = torch.tensor([foreign, max(self.canary_before_s, canary_after_s),
                               -min(self.canary_before_s, canary_after_s)], dtype=torch.float64, device=self.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # one decision for all ranks
        share, slowest_s, fastest_s = agreed[0].item(), agreed[1].item(), -agreed[2].item()
        self.canary.fastest_s = min(self.canary.fastest_s, fastest_s)
        return Disturbance(share, slowest_s / self.canary.fastest_s, slowest_s)

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


def rebase_slowdowns(record, fastest_s: float) -> None:
    """Restate, in place, every slowdown in ``record`` against ``fastest_s``, the job's fastest canary time.

    ``record`` is a rank's result: dicts and lists nested in any way; a dict holding a
    ``canary_s`` (from :meth:`Disturbance.as_dict`) gets ``slowdown = canary_s / fastest_s``.
    A measurement taken before the machine showed its best speed is judged by that best.
    """
    if isinstance(record, dict):
        if "canary_s" in record and "slowdown" in record:
            record["slowdown"] = record["canary_s"] / fastest_s
        for value in record.values():
            rebase_slowdowns(value, fastest_s)
    elif isinstance(record, list):
        for value in record:
            rebase_slowdowns(value, fastest_s)


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
