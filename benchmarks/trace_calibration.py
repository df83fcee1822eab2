"""Calibrating from real profiler traces: held-out kernel error before and after fitting.

Fits one profile per trace in ``../shared/traces`` (beside the repository; PyTorch
profiler traces of multi-GPU A100 runs, see the README there) with ``--system dgx-a100``,
as ``mpsim calibrate --from-trace`` does, on the accelerator file that describes the
trace's device (the 40 GB file for the PG509-200 boards, the 80 GB one for
A100-SXM4-80GB). A third of the distinct GEMM shapes and collective sizes are held out
(``mpsim/calibrate/trace_fit/split.py``); the fit never sees them.

Per trace it prints, for the held-out GEMMs and collectives, the median and max absolute
error of the predicted kernel time before fitting (the datasheet model alone) and after
(the fitted profile, falling back to the datasheet where it has no fit). A GEMM is
priced as it ran: where the trace shows a collective beside it, slowed by the SMs the
collective holds (``collective_channels`` of the system), as ``mpsim run`` prices compute
beside a collective; the GEMMs that ran alone and those beside other streams' kernels
are also reported apart. Last::

    gemm_median_abs_error_pct=<a> collective_median_abs_error_pct=<b> kernels=<n>

with ``a`` and ``b`` after fitting, pooled over every trace's held-out kernels, and ``n``
the number of held-out kernels those medians are taken over.

Usage: python benchmarks/trace_calibration.py [TRACE_FOLDER]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from mpsim.calibrate.from_trace import accelerator_for, read_traces
from mpsim.calibrate.trace_fit.build import build_profile
from mpsim.calibrate.trace_fit.samples import trace_samples
from mpsim.specs.catalog import load_accelerator, load_system

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SYSTEM = "dgx-a100"
# the A100 files, one of which describes each trace's device by name
A100_FILES = ("a100-sxm-40gb", "a100-sxm-80gb")


def _stats(values: list[float]) -> str:
    if not values:
        return "no kernels"
    return f"median {np.median(values):7.1f} %  max {np.max(values):8.1f} %"


def main() -> int:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else TRACES
    files = sorted(str(p) for p in folder.glob("*.json.gz"))
    if not files:
        print(f"no traces in {folder}", file=sys.stderr)
        return 2
    system = load_system(SYSTEM)
    pooled = {"gemm": [], "collectives": []}
    for path in files:
        trace = read_traces([path], lambda text: print(text, file=sys.stderr))[0]
        name = next(n for n in A100_FILES if load_accelerator(n).matches_device("cuda", trace.device_name or ""))
        accelerator = accelerator_for([trace], system, name)
        result = build_profile(trace_samples([trace]), [Path(path).name], trace.device_name, trace.device_sms,
                               SYSTEM, system, accelerator)
        print(f"{Path(path).name}: {trace.device_name}, priced on {accelerator.name} in {SYSTEM}")
        for label, held in (("gemm", result.gemm), ("collectives", result.collectives)):
            print(f"  {label:<12} {len(held.after_pct):4d} held-out kernels, {len(held.shapes):3d} shapes | "
                  f"before: {_stats(held.before_pct)} | after: {_stats(held.after_pct)}")
            if label == "gemm" and held.after_pct_where(False):
                print(f"  {'':<12} after, {len(held.after_pct_where(True))} that ran alone: "
                      f"{_stats(held.after_pct_where(True))} | {len(held.after_pct_where(False))} beside other "
                      f"streams' kernels: {_stats(held.after_pct_where(False))}")
            pooled[label].extend(held.after_pct)
        for fit in result.profile.compute.gemm_fits:
            efficiency = "-" if fit.efficiency is None else f"{100 * fit.efficiency:.1f} %"
            bandwidth = "-" if fit.bandwidth is None else f"{fit.bandwidth / 1e9:.0f} GB/s"
            output = "-" if fit.output_bandwidth is None else f"{fit.output_bandwidth / 1e9:.0f} GB/s"
            misaligned = "-" if fit.misaligned_efficiency is None else f"{100 * fit.misaligned_efficiency:.1f} %"
            print(f"  fit gemm {fit.dtype}: {fit.launch_s * 1e6:.2f} us + flops at {efficiency} of peak "
                  f"({misaligned} misaligned) + operands at {bandwidth} + output at {output} ({fit.kernels} kernels, "
                  f"{fit.shapes} shapes)")
    gemm, collectives = pooled["gemm"], pooled["collectives"]
    gemm_median = float(np.median(gemm)) if gemm else float("nan")
    collective_median = float(np.median(collectives)) if collectives else float("nan")
    print(f"gemm_median_abs_error_pct={gemm_median:.1f} collective_median_abs_error_pct={collective_median:.1f} "
          f"kernels={len(gemm) + len(collectives)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
