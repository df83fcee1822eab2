"""The text of ``mpsim validate --trace``: which mode and why, one table, the step.

Pass mode lists every pass of every rank (measured median over the profiler steps,
predicted, error), each rank's block closed by one row per kind; past
``MAX_PASS_ROWS`` passes only the per-kind rows are printed. Category mode lists each
rank's kernel categories, seconds per step. The last line is machine-readable:
``mode=<passes|categories> step_error_pct=<x> median_abs_error_pct=<y> max_abs_error_pct=<z>``
(the per-pass or per-category errors; ``n/a`` where nothing was compared).
"""

from __future__ import annotations

import statistics

from mpsim.traces.compare import TraceComparison, kind_summary
from mpsim.units import format_seconds

MAX_PASS_ROWS = 64


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:10.3f}"


def _pct(value: float | None) -> str:
    return "       n/a" if value is None else f"{value:+9.1f}%"


def _step_range(steps: tuple[int, ...]) -> str:
    return f"step #{steps[0]}" if len(steps) == 1 else f"{len(steps)} steps #{steps[0]}-#{steps[-1]}"


def _pass_table(comparison: TraceComparison) -> tuple[list[str], list[float]]:
    rows = comparison.passes
    detailed = len(rows) <= MAX_PASS_ROWS
    lines = [f"{'rank':>4}  {'pass':<12} {'steps':>5} {'measured ms':>11} {'predicted ms':>12} {'error':>10}"]
    for rank in comparison.traces:
        mine = [r for r in rows if r.rank == rank]
        if detailed:
            lines += [f"{rank:>4}  {r.label:<12} {r.steps:>5} {_ms(r.measured_s):>11} {_ms(r.predicted_s):>12} "
                      f"{_pct(r.error_pct)}" for r in mine]
        for kind, count, measured, predicted, median_error, worst in kind_summary(mine):
            label = f"all {kind} ({count})"
            lines.append(f"{rank:>4}  {label:<12} {'':>5} {_ms(measured):>11} {_ms(predicted):>12} "
                         f"{_pct(100 * (predicted - measured) / measured if measured > 0 else None)}"
                         f"   median {median_error:+.1f} %, max |{worst:.1f}| %")
    if not detailed:
        lines.append(f"({len(rows)} passes: per-pass rows left out past {MAX_PASS_ROWS}; kind rows sum the "
                     f"passes' medians)")
    return lines, [abs(r.error_pct) for r in rows]


def _category_table(comparison: TraceComparison) -> tuple[list[str], list[float]]:
    lines = [f"{'rank':>4}  {'category':<26} {'measured ms':>11} {'predicted ms':>12} {'error':>10}"]
    errors = []
    for row in comparison.categories:
        error = row.error_pct
        if error is not None:
            errors.append(abs(error))
        lines.append(f"{row.rank:>4}  {row.category:<26} {_ms(row.measured_s):>11} {_ms(row.predicted_s):>12} "
                     f"{_pct(error)}")
    lines.append("(GPU busy time per step: each category's kernels as a union, median over the profiler steps; "
                 "predicted: the simulated step's ops in the same categories)")
    return lines, errors


def format_comparison(comparison: TraceComparison) -> str:
    """The report of one trace comparison."""
    result = comparison.result
    scenario = result.scenario
    sources = ", ".join(f"rank {rank}: {trace.source}" for rank, trace in comparison.traces.items())
    lines = [(f"scenario     {scenario.name}: {result.schedule.name}, pp {result.layout.pp}, "
              f"{result.layout.num_microbatches} microbatches"),
             f"traces       {sources}",
             f"mode         {comparison.mode}: {comparison.why}", ""]
    table, errors = _pass_table(comparison) if comparison.mode == "passes" else _category_table(comparison)
    lines += table
    lines.append("")
    if comparison.measured_step_s is not None:
        steps = comparison.step_numbers
        lines.append(f"step         measured {format_seconds(comparison.measured_step_s)} (ProfilerStep, slowest rank, "
                     f"median of {_step_range(steps)}), predicted "
                     f"{format_seconds(comparison.predicted_step_s)} ({comparison.step_error_pct:+.1f} %; pipeline "
                     f"ends at {format_seconds(result.timeline.pipeline_end_s)})")
    else:
        lines.append(f"step         no ProfilerStep common to every trace; predicted "
                     f"{format_seconds(comparison.predicted_step_s)}")
    lines += [f"note         {note}" for note in comparison.notes]
    step_error = comparison.step_error_pct
    lines.append(f"mode={comparison.mode} "
                 f"step_error_pct={'n/a' if step_error is None else f'{step_error:.2f}'} "
                 f"median_abs_error_pct={f'{statistics.median(errors):.2f}' if errors else 'n/a'} "
                 f"max_abs_error_pct={f'{max(errors):.2f}' if errors else 'n/a'}")
    return "\n".join(lines)
