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

And the host time of one GEMM call: the median duration of the ``aten::mm`` and
``aten::addmm`` CPU ops (the dispatcher, cuBLAS's host work and its launch, no Python), the
cost each per-expert cuBLASLt GEMM of Transformer Engine's grouped linear pays on the host
(docs/parallelism.md), beside the launch interval that prices it.

The last line is ``devices=<n> kinds=<n> traces=<n> queued_gap_us=<pooled median>
launch_interval_us=<pooled median>``.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from mpsim.calibrate.trace_fit.samples import trace_samples
from mpsim.traces import load_trace
from mpsim.traces.host import launch_intervals_s, starved_share
from mpsim.traces.variation import kind_variation

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


GEMM_OPS = ("aten::mm", "aten::addmm")


def gemm_call_durations_us(path: str) -> list[float]:
    """Durations of the trace's GEMM CPU ops (``GEMM_OPS``), in microseconds."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        events = json.load(handle).get("traceEvents", [])
    return [float(event["dur"]) for event in events
            if event.get("ph") == "X" and event.get("cat") == "cpu_op" and event.get("name") in GEMM_OPS]


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
    gemm_calls_us = [us for path in paths for us in gemm_call_durations_us(path)]
    if gemm_calls_us:
        print(f"host time of one GEMM call ({' and '.join(GEMM_OPS)} CPU ops): median "
              f"{float(np.median(gemm_calls_us)):.1f} us over {len(gemm_calls_us)}")
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
