"""``mpsim run``: simulate one training step of a scenario."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import add_scenario_args, non_negative_int
from mpsim.errors import EXIT_OUT_OF_MEMORY, InputError


def _run(args: argparse.Namespace) -> int:
    from mpsim.results import format_summary, summarize, summary_json
    from mpsim.results.report import placement_warning
    from mpsim.simulate import bubble_reference, simulate
    from mpsim.specs import load_scenario
    from mpsim.units import format_bytes

    _check_trace_options(args)
    loaded = load_scenario(args.scenario, args.overrides)
    try:
        result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None)
    except InputError as exc:
        raise loaded.origins.locate(exc) from None
    reference = bubble_reference(result)
    summary = summarize(result, reference)
    print(summary_json(summary) if args.json else format_summary(summary))
    warning = placement_warning(result.layout, result.scenario.cluster.system)
    if warning:
        print(warning, file=sys.stderr)
    if args.trace:
        from mpsim.results.trace import chosen_mode, write_trace

        ops = not args.trace_actions_only
        mode, note = chosen_mode(result, ops, "compact" if args.trace_compact else "full" if args.trace_full else "auto")
        if note:
            print(f"note: {note}", file=sys.stderr)
        write_trace(result, args.trace, ops=ops, reference=reference, compact=mode == "compact")
        print(f"{mode} trace written to {args.trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.memory_plot:
        from mpsim.results.memory_views import plot_memory

        plot_memory(result, summary.memory, args.memory_plot)
        print(f"memory timeline written to {args.memory_plot}", file=sys.stderr)
    if args.memory_snapshot:
        from mpsim.results.memory_views import write_memory_snapshot

        if not 0 <= args.memory_snapshot_rank < result.schedule.num_ranks:
            raise InputError(f"--memory-snapshot-rank must be 0..{result.schedule.num_ranks - 1}")
        write_memory_snapshot(result, summary.memory, args.memory_snapshot_rank, args.memory_snapshot)
        print(f"memory snapshot of rank {args.memory_snapshot_rank} written to {args.memory_snapshot} "
              f"(open it in https://pytorch.org/memory_viz)", file=sys.stderr)
    if args.report:
        from mpsim.results.html import write_run_report

        write_run_report(args.report, result, summary, reference)
        print(f"report written to {args.report} (open it in a browser; it needs no network)", file=sys.stderr)
    if args.plot:
        from mpsim.results.plot import plot_timeline

        plot_timeline(result, summary, args.plot, reference=reference)
        print(f"timeline written to {args.plot}", file=sys.stderr)
    if summary.out_of_memory:
        print(f"out of memory: the busiest rank peaks at {format_bytes(summary.peak_memory_bytes)} of "
              f"{format_bytes(summary.capacity_bytes)} (exit code {EXIT_OUT_OF_MEMORY})", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    return 0


def _check_trace_options(args: argparse.Namespace) -> None:
    """The trace's form is asked for with the trace, and only one form at a time."""
    if args.trace_compact and args.trace_full:
        raise InputError("give --trace-compact or --trace-full, not both", field="--trace-full")
    for option, given in (("--trace-compact", args.trace_compact), ("--trace-full", args.trace_full)):
        if given and not args.trace:
            raise InputError("needs --trace FILE to write the trace to", field=option)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``run`` to the command parser."""
    run = commands.add_parser("run", help="simulate one training step of a scenario")
    add_scenario_args(run)
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object (docs/json.md)")
    run.add_argument("--trace", metavar="FILE",
                     help="write a Chrome/Perfetto trace JSON (gzip-compressed if FILE ends in .gz; docs/traces.md)")
    run.add_argument("--trace-actions-only", action="store_true", help="trace whole actions, not every op")
    run.add_argument("--trace-compact", action="store_true",
                     help="trace whole actions, communication as counters (chosen for large traces; docs/traces.md)")
    run.add_argument("--trace-full", action="store_true", help="trace every op, however large the trace")
    run.add_argument("--plot", metavar="FILE", help="write a timeline picture (.png, .svg, .pdf)")
    run.add_argument("--memory-plot", metavar="FILE", help="write memory per device over the step")
    run.add_argument("--memory-snapshot", metavar="FILE",
                     help="write a PyTorch memory snapshot (pickle) of one rank, for pytorch.org/memory_viz")
    run.add_argument("--memory-snapshot-rank", type=non_negative_int, default=0, metavar="RANK",
                     help="pipeline rank of --memory-snapshot (default 0)")
    run.add_argument("--report", metavar="FILE", help="write an interactive HTML report (one file, no network needed)")
    run.set_defaults(handler=_run)
