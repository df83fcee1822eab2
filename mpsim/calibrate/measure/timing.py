"""Clocks and repeat-until-stable measurement, on CPU and on CUDA.

On CPU a kernel has finished when the call returns, so the host clock
(``time.perf_counter``, CLOCK_MONOTONIC on Linux, which every process on the machine
shares) times it directly and lines up the ranks' timelines without any exchange.

On CUDA a call returns as soon as the kernel is queued; the host clock would time the
launch. :class:`CudaClock` records a CUDA event at each mark on the current stream and
converts them to seconds after one synchronize at the end, relative to an event
recorded right after a barrier, so every rank's marks share that barrier as time zero.

A measurement is the median of repeats after warm-up calls, with the spread reported
as the interquartile range over the median: one number that says how much to trust
the median, robust to the odd preempted repeat.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


class CpuClock:
    """Marks on the shared monotonic host clock, in seconds."""

    def mark(self):
        return time.perf_counter()

    def resolve(self, marks: list) -> list[float]:
        return [float(m) for m in marks]

    def sync(self) -> None:
        pass


class CudaClock:
    """Marks as CUDA events on the current stream; seconds after the zero event."""

    def __init__(self) -> None:
        torch.cuda.synchronize()
        self.zero = torch.cuda.Event(enable_timing=True)
        self.zero.record()
        self.zero_host_s = time.perf_counter()

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def resolve(self, marks: list) -> list[float]:
        torch.cuda.synchronize()
        return [self.zero_host_s + self.zero.elapsed_time(m) / 1e3 for m in marks]

    def sync(self) -> None:
        torch.cuda.synchronize()


def make_clock(device: str):
    """The clock for ``device`` ("cpu" or "cuda")."""
    return CudaClock() if device == "cuda" else CpuClock()


@dataclass(frozen=True)
class Measurement:
    """Median seconds of repeated calls, and how much they scattered."""

    seconds: float
    spread: float  # interquartile range / median
    samples: int

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "spread": self.spread, "samples": self.samples}


def summarize(samples: list[float]) -> Measurement:
    """Median and relative interquartile range of ``samples``."""
    ordered = sorted(samples)
    median = statistics.median(ordered)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1, q3 = ordered[0], ordered[-1]
    return Measurement(median, (q3 - q1) / median if median > 0 else 0.0, len(ordered))


def measure(fn: Callable[[], object], device: str, warmup: int = 2, min_repeats: int = 5, max_repeats: int = 40,
            budget_s: float = 0.12) -> Measurement:
    """Time ``fn`` after ``warmup`` calls: as many repeats as fit in ``budget_s``, within the bounds.

    Each repeat is timed on its own (not a mean over a loop) so that the median can
    drop repeats a busy neighbour or the allocator disturbed.
    """
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < max_repeats:
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
        else:
            begin_s = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begin_s)
        if len(samples) >= min_repeats and time.perf_counter() - started > budget_s:
            break
    return summarize(samples)
