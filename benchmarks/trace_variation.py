"""Step-to-step variation of real kernels, per op kind, and the gap between queued kernels, on published traces.

Reads the PyTorch profiler traces in ``../shared/traces`` (beside the repository: Holistic
Trace Analysis test data, commit f4d0062, MIT licence, copyright Meta Platforms, Inc. and
affiliates; real multi-GPU A100 training runs) or the files given, groups each device's
traces by the device name they record, and prints each op kind's coefficient of variation
(``mpsim/traces/variation.py``: the i-th launch of a kernel name in each step is one
piece of work; its time's standard deviation over its mean, the median over kernels
weighted by their time). These are the figures ``PUBLISHED_CV`` in
``mpsim/reliability/op_variation.py`` ships, for the kinds it takes from here.

It also prints the median gap between consecutive kernels of a stream when the next one
was already queued (``mpsim/calibrate/trace_fit/samples.py``, ``launch_gaps``: the
device's own switch between kernels, without waiting for the CPU) per trace and pooled
over all traces given: the A100 files' ``kernel_overhead``; and the median interval
between consecutive kernel launches of one CPU thread (``mpsim/traces/host.py``: the
host's pace), with the share of kernels that started as soon as they were launched:
the default ``training.host_launch_interval``.

The last line is ``devices=<n> kinds=<n> traces=<n> queued_gap_us=<pooled median>
launch_interval_us=<pooled median>``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from mpsim.calibrate.trace_fit.samples import trace_samples
from mpsim.traces import load_trace
from mpsim.traces.host import launch_intervals_s, starved_share
from mpsim.traces.variation import kind_variation

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="trace files (default: every *.json.gz in ../shared/traces)")
    args = parser.parse_args()
    paths = args.traces or sorted(str(p) for p in TRACES.glob("*.json.gz"))
    if not paths:
        parser.error(f"no traces given and none found in {TRACES}")
    by_device = defaultdict(list)
    gaps_s: list[float] = []
    intervals_s: list[float] = []
    for path in paths:
        trace = load_trace(path)
        queued = trace_samples([trace]).queued_gaps_s
        gaps_s += queued
        launches = launch_intervals_s(trace)
        intervals_s += launches
        print(f"read {Path(path).name}: {trace.device_name}, {len(trace.steps)} steps, {len(trace.kernels)} kernels; "
              f"median gap between queued kernels {1e6 * float(np.median(queued)):.2f} us over {len(queued)}; "
              f"median launch interval {1e6 * float(np.median(launches)):.1f} us over {len(launches)}, "
              f"{100 * starved_share(trace):.0f} % of kernels started on launch", flush=True)
        by_device[trace.device_name].append(trace)
    kinds = 0
    print(f"\n{'device':<24} {'kind':<11} {'cv':>7} {'kernels':>8} {'launches':>9} {'time ms':>9}")
    for device, traces in sorted(by_device.items()):
        for kind, row in kind_variation(traces).items():
            kinds += 1
            print(f"{device:<24} {kind:<11} {row.cv:>7.4f} {row.groups:>8} {row.kernels:>9} {row.seconds * 1e3:>9.1f}")
    print(f"devices={len(by_device)} kinds={kinds} traces={len(paths)} "
          f"queued_gap_us={1e6 * float(np.median(gaps_s)):.2f} launch_interval_us={1e6 * float(np.median(intervals_s)):.1f}")


if __name__ == "__main__":
    main()
