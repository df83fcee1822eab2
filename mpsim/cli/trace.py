"""``mpsim trace summary``: where a real GPU run's time went, from its PyTorch profiler traces.

Example::

    mpsim trace summary traces/ --top 5
    mpsim trace summary rank0.json.gz --step 552 --json summary.json

Each file is one rank's Kineto trace (``.json`` or ``.json.gz``); a folder stands for its
trace files. Per rank it prints GPU busy and idle time by kernel category, the largest
GEMM shapes with their achieved TFLOP/s, the collectives with their nccl-tests bus
bandwidth and the overlap of compute with communication, for one step (``--step``) or as
the mean over the trace's ``ProfilerStep`` ranges (docs/trace-reading.md).
"""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import non_negative_int, positive_int


def _summary(args: argparse.Namespace) -> int:
    import json

    from mpsim.traces import load_traces
    from mpsim.traces.report import format_summary, summary_dict
    from mpsim.traces.summary import summarize

    if args.json not in (None, "-"):
        from mpsim.paths import check_writable

        check_writable(args.json, "--json")
    summaries = [summarize(trace, args.step) for trace in load_traces(args.traces)]
    if args.json == "-":
        print(json.dumps([summary_dict(s) for s in summaries], indent=2))
        return 0
    print("\n\n".join(format_summary(s, args.top) for s in summaries))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump([summary_dict(s) for s in summaries], stream, indent=2)
            stream.write("\n")
        print(f"summary written to {args.json}", file=sys.stderr)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``trace summary`` to the command parser."""
    trace = commands.add_parser("trace", help="read PyTorch profiler (Kineto) traces of real GPU runs")
    actions = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    summary = actions.add_parser("summary", help="GPU time by kernel category, GEMM shapes and collectives per rank")
    summary.add_argument("traces", nargs="+", metavar="TRACE",
                         help="a trace file (.json or .json.gz, one rank) or a folder of them")
    summary.add_argument("--step", type=non_negative_int, metavar="N",
                         help="summarize ProfilerStep#N only (default: the mean over the trace's steps)")
    summary.add_argument("--json", metavar="FILE",
                         help="also write the summaries as JSON (seconds, bytes, FLOP/s; - prints it in place of "
                              "the text)")
    summary.add_argument("--top", type=positive_int, default=10, metavar="N",
                         help="GEMM shapes and collective groups to print (default 10)")
    summary.set_defaults(handler=_summary)
