"""Seconds to write the pictures and files of a large job, and the trace's size.

For Megatron 1T on 3,072 A100 (TP 8, PP 64, DP 6, 64 microbatches per pipeline: 8,192
actions on 64 pipeline ranks) the scenario is simulated once, then each output is
written as ``mpsim run`` writes it by default, best of three: the HTML report
(``--report``), the PNG timeline (``--plot``) and the Chrome/Perfetto trace (``--trace``, in
the form it chooses at this size).
Targets: report <= 2 s, PNG <= 1 s, trace <= 2 s and <= 50 MB. The last line is
``report_s=<a> png_s=<b> trace_s=<c> trace_mb=<d>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mpsim.results import summarize
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "megatron_1t_3072xa100.yaml"
REPEATS = 3


def best_of(write, path: Path) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        write(path)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    args = parser.parse_args(argv)
    from mpsim.results.html import write_run_report
    from mpsim.results.plot import plot_timeline
    from mpsim.results.trace import chosen_mode, write_trace

    result = simulate(load_scenario(args.scenario).scenario)
    reference = bubble_reference(result)
    summary = summarize(result, reference)
    actions = sum(len(records) for records in result.timeline.actions)
    print(f"{summary.scenario}: {actions:,} actions on {result.timeline.num_ranks} pipeline ranks")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        report_s = best_of(lambda p: write_run_report(p, result, summary, reference), out / "report.html")
        print(f"HTML report: {report_s:.3f} s, {(out / 'report.html').stat().st_size / 1e6:.2f} MB")
        png_s = best_of(lambda p: plot_timeline(result, summary, str(p), reference=reference), out / "timeline.png")
        print(f"PNG timeline: {png_s:.3f} s")
        mode, note = chosen_mode(result)  # the form --trace writes by default at this size
        trace_s = best_of(lambda p: write_trace(result, str(p), reference=reference, compact=mode == "compact"),
                          out / "trace.json")
        trace_mb = (out / "trace.json").stat().st_size / 1e6
        print(f"trace ({mode}{': ' + note if note else ''}): {trace_s:.3f} s, {trace_mb:.1f} MB")
    print(f"report_s={report_s:.3f} png_s={png_s:.3f} trace_s={trace_s:.3f} trace_mb={trace_mb:.1f}")


if __name__ == "__main__":
    main()
