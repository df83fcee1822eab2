"""How fast the host launched kernels in a real run, and how often the GPU waited for it.

In eager PyTorch every kernel is launched by a CPU thread that first runs the framework's
Python, the dispatcher and the CUDA runtime call. When the GPU finishes kernels faster
than the CPU launches them, it idles between them; when the kernels are long, the CPU
runs ahead and its time is hidden. The pace of the launching thread is what decides
which: its interval between consecutive launches, over every kernel it launched inside
the profiled steps, is the figure ``training.host_launch_interval`` prices
(docs/cost-model.md, "Host launch time").

The forward runs on the training loop's thread and the backward on autograd's own
thread, so intervals are taken per launching thread and pooled. An interval that spans
a wait of the thread (a synchronisation, the other thread's turn) is long and rare; the
median, not the mean, keeps them from setting the figure.
"""

from __future__ import annotations

from collections import defaultdict

from mpsim.traces.model import Trace

# a kernel that began this soon after the call that launched it had no queue ahead of it:
# the GPU was waiting for the host (Kineto timestamps are whole or tenths of microseconds)
STARVED_WITHIN_S = 20e-6


def launch_intervals_s(trace: Trace) -> list[float]:
    """Seconds between consecutive kernel launches of one CPU thread, inside profiled steps."""
    launches: dict[tuple[int, int | None], list[float]] = defaultdict(list)
    for kernel in trace.kernels:
        if kernel.launch_s is not None and kernel.step is not None:
            launches[(kernel.step, kernel.launch_thread)].append(kernel.launch_s)
    intervals: list[float] = []
    for times in launches.values():
        times.sort()
        intervals += [b - a for a, b in zip(times, times[1:])]
    return intervals


def starved_share(trace: Trace) -> float:
    """Share of launched kernels that started within ``STARVED_WITHIN_S`` of their launch call."""
    launched = [k for k in trace.kernels if k.launch_s is not None and k.step is not None]
    if not launched:
        return 0.0
    return sum(1 for k in launched if k.start_s - k.launch_s <= STARVED_WITHIN_S) / len(launched)
