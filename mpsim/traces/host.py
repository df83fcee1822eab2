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
    forward, backward = launch_intervals_by_pass(trace)
    return forward + backward


def _backward_op(name: str) -> bool:
    """An op or annotation that only the autograd engine's backward runs."""
    return name.startswith("autograd::engine") or name.endswith("Backward0") or name.endswith("_backward")


def launch_intervals_by_pass(trace: Trace) -> tuple[list[float], list[float]]:
    """The launch intervals of the threads that run forwards and of those that run backwards.

    A thread is a backward thread when most of the kernels it launched sit under the
    autograd engine's ops (``autograd::engine::evaluate_function``, ``*Backward0``,
    ``aten::*_backward``): PyTorch runs a backward on its engine's own thread, so the two
    are apart in every eager trace, and their paces differ (a forward runs Python module
    by module, a backward the engine's C++ loop).
    """
    launches: dict[tuple[int, int | None], list[float]] = defaultdict(list)
    kernels: dict[int | None, int] = defaultdict(int)
    backward: dict[int | None, int] = defaultdict(int)
    for kernel in trace.kernels:
        if kernel.launch_s is not None and kernel.step is not None:
            launches[(kernel.step, kernel.launch_thread)].append(kernel.launch_s)
            kernels[kernel.launch_thread] += 1
            backward[kernel.launch_thread] += any(_backward_op(name) for name in kernel.op_names)
    by_kind: tuple[list[float], list[float]] = ([], [])
    for (_, thread), times in launches.items():
        times.sort()
        by_kind[2 * backward[thread] > kernels[thread]].extend(b - a for a, b in zip(times, times[1:]))
    return by_kind


def starved_share(trace: Trace) -> float:
    """Share of launched kernels that started within ``STARVED_WITHIN_S`` of their launch call."""
    launched = [k for k in trace.kernels if k.launch_s is not None and k.step is not None]
    if not launched:
        return 0.0
    return sum(1 for k in launched if k.start_s - k.launch_s <= STARVED_WITHIN_S) / len(launched)
