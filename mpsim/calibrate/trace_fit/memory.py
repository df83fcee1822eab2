"""Memory-bound kernels' achieved bandwidth and the gaps between kernels, from trace samples.

Elementwise kernels (adds, activations, copies, fills) move their tensors once and do
little arithmetic, so one line prices them all::

    t = latency_s + bytes / bandwidth

fitted like the GEMMs and collectives (robust, relative, non-negative) on the kernels
whose bytes the launching op's shapes and dtypes give (``samples.memory_samples``).
The bandwidth is what these kernels reach in a real step, which may sit above the HBM's
rate when their tensors live in the L2 cache; so the line prices sizes up to the largest
it saw (``max_bytes``) and larger ones, the optimizer's sweep over every parameter among
them, keep the datasheet's streaming rate.

The gaps between kernels are reported as medians: a per-kernel overhead is one number,
and the median ignores the long idle stretches of a data loader or a peer's wait.
"""

from __future__ import annotations

import numpy as np

from mpsim.calibrate.trace_fit.robust import fit_nonnegative
from mpsim.calibrate.trace_fit.samples import MemorySample
from mpsim.specs.calibration import LaunchGaps, StreamFit
from mpsim.traces.host import launch_pace

MIN_SIZES = 3  # distinct sizes before a line is fitted to memory-bound kernels


def fit_memory(samples: list[MemorySample]) -> StreamFit | None:
    """The streaming line over every sized memory-bound kernel, or None when they give none."""
    if len({s.bytes for s in samples}) < MIN_SIZES:
        return None
    features = np.array([[1e-6, s.bytes / 1e9] for s in samples])
    seconds = np.array([s.seconds for s in samples])
    latency, per_byte = fit_nonnegative(features, seconds)
    if per_byte <= 0:
        return None
    fit = StreamFit(bandwidth=float(1e9 / per_byte), latency_s=float(latency) * 1e-6,
                    max_bytes=max(s.bytes for s in samples))
    errors = np.array([fit.seconds(s.bytes) / s.seconds - 1.0 for s in samples])
    return fit.model_copy(update={"rms_error": float(np.sqrt(np.mean(errors ** 2)))})


def launch_summary(waiting_gaps_s: list[float], queued_gaps_s: list[float],
                   forward_intervals_s: list[float] = (), backward_intervals_s: list[float] = (),
                   forward_within: bool = False, backward_within: bool = False) -> LaunchGaps | None:
    """Median gaps between kernels, with and without the GPU waiting for the CPU, and the
    host's pace between launches (``traces.host.launch_pace``: the mean of the intervals
    inside annotated passes, else the median), over all threads and per pass kind."""
    launch_intervals_s = [*forward_intervals_s, *backward_intervals_s]
    if not waiting_gaps_s and not queued_gaps_s and not launch_intervals_s:
        return None
    # per kind that has intervals, how its pace is taken; pooled, a mean only where every kind's is
    kinds = [(name, "mean within passes" if within else "median")
             for name, within, intervals in (("forwards", forward_within, forward_intervals_s),
                                             ("backwards", backward_within, backward_intervals_s)) if intervals]
    labels = {label for _, label in kinds}
    pooled_within = labels == {"mean within passes"}
    if len(labels) > 1:
        statistic = ", ".join(f"{name} {label}" for name, label in kinds)
    else:
        statistic = labels.pop() if labels else "median"
    return LaunchGaps(waiting_gap_s=float(np.median(waiting_gaps_s)) if waiting_gaps_s else None,
                      waiting_samples=len(waiting_gaps_s),
                      queued_gap_s=float(np.median(queued_gaps_s)) if queued_gaps_s else None,
                      queued_samples=len(queued_gaps_s),
                      host_interval_s=launch_pace(launch_intervals_s, pooled_within),
                      host_interval_samples=len(launch_intervals_s),
                      host_interval_forward_s=launch_pace(list(forward_intervals_s), forward_within),
                      host_interval_backward_s=launch_pace(list(backward_intervals_s), backward_within),
                      host_interval_statistic=statistic)
