"""How fast the host launched kernels in a real run, and how often the GPU waited for it.

In eager PyTorch every kernel is launched by a CPU thread that first runs the framework's
Python, the dispatcher and the CUDA runtime call. When the GPU finishes kernels faster
than the CPU launches them, it idles between them; when the kernels are long, the CPU
runs ahead and its time is hidden. The pace of the launching thread is what decides
which: its interval between consecutive launches, over every kernel it launched inside
the profiled steps, is the figure ``training.host_launch_interval`` prices
(docs/parallelism.md, "The host that launches the kernels").

The forward runs on the training loop's thread and the backward on autograd's own
thread, so intervals are taken per launching thread and pooled. What a pass costs the
host is the sum of its intervals: their mean times its launches. An interval that spans
a wait of the thread (a synchronisation, the other thread's turn) is no launch work,
though, and must not enter it. Where the trace annotates its passes (``Forward 3``,
``Backward 3``, ``0F3``: torch.distributed.pipelining's record_function ranges), only the
intervals between two launches inside the same pass window are kept, and their mean is
the pace (``launch_pace``), for each kind of pass the windows hold. Without annotations
(or without those of one kind) the waits cannot be told apart from the launches, and the
median over every interval stands in for it: a lower figure where a
few launches take long (in the project's H200 trace the median is 64 us on the forward
thread and 36 us on the backward one, the mean within passes 74 and 46 us).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

import numpy as np

from mpsim.traces.model import Trace
from mpsim.traces.passes import parse_pass

# a kernel that began this soon after the call that launched it had no queue ahead of it:
# the GPU was waiting for the host (Kineto timestamps are whole or tenths of microseconds)
STARVED_WITHIN_S = 20e-6


def launch_intervals_s(trace: Trace) -> list[float]:
    """Seconds between consecutive kernel launches of one CPU thread, inside profiled steps."""
    forward, backward = launch_intervals_by_pass(trace)
    return forward + backward


def _backward_op(name: str) -> bool:
    """An op or annotation that only the autograd engine's backward runs."""
    return name.startswith("autograd::engine") or name.endswith("Backward0") or name.endswith("_backward")


def pass_windows(trace: Trace) -> list[tuple[float, float]]:
    """Time ranges of the trace's pass annotations, in start order (empty: none annotated)."""
    return sorted((a.start_s, a.start_s + a.duration_s) for a in trace.annotations if parse_pass(a.name) is not None)


def _window_of(windows: list[tuple[float, float]], starts: list[float], at: float) -> int | None:
    """Index of the window holding ``at`` (windows sorted by start), or None."""
    index = bisect_right(starts, at) - 1
    if index >= 0 and at <= windows[index][1]:
        return index
    return None


def launch_pace(intervals_s: list[float], within_passes: bool) -> float | None:
    """The host's seconds per launch: the mean of intervals inside passes, else their median (module doc)."""
    if not intervals_s:
        return None
    return float(np.mean(intervals_s) if within_passes else np.median(intervals_s))


def launch_intervals_by_pass(trace: Trace, within_passes: bool = False) -> tuple[list[float], list[float]]:
    """The launch intervals of the threads that run forwards and of those that run backwards.

    A thread is a backward thread when most of the kernels it launched sit under the
    autograd engine's ops (``autograd::engine::evaluate_function``, ``*Backward0``,
    ``aten::*_backward``): PyTorch runs a backward on its engine's own thread, so the two
    are apart in every eager trace, and their paces differ (a forward runs Python module
    by module, a backward the engine's C++ loop). ``within_passes``: only the intervals
    between two launches inside one annotated pass (``pass_windows``; none without them).
    """
    launches: dict[tuple[int, int | None], list[float]] = defaultdict(list)
    kernels: dict[int | None, int] = defaultdict(int)
    backward: dict[int | None, int] = defaultdict(int)
    for kernel in trace.kernels:
        if kernel.launch_s is not None and kernel.step is not None:
            launches[(kernel.step, kernel.launch_thread)].append(kernel.launch_s)
            kernels[kernel.launch_thread] += 1
            backward[kernel.launch_thread] += any(_backward_op(name) for name in kernel.op_names)
    windows = pass_windows(trace) if within_passes else []
    starts = [start for start, _ in windows]
    by_kind: tuple[list[float], list[float]] = ([], [])
    for (_, thread), times in launches.items():
        times.sort()
        pairs = zip(times, times[1:])
        if within_passes:  # only the intervals inside one pass (module doc)
            pairs = ((a, b) for a, b in pairs
                     if (window := _window_of(windows, starts, a)) is not None and b <= windows[window][1])
        by_kind[2 * backward[thread] > kernels[thread]].extend(b - a for a, b in pairs)
    return by_kind


def starved_share(trace: Trace) -> float:
    """Share of launched kernels that started within ``STARVED_WITHIN_S`` of their launch call."""
    launched = [k for k in trace.kernels if k.launch_s is not None and k.step is not None]
    if not launched:
        return 0.0
    return sum(1 for k in launched if k.start_s - k.launch_s <= STARVED_WITHIN_S) / len(launched)
