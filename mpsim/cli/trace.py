"""``mpsim trace summary`` / ``variation``: what a real GPU run's PyTorch profiler traces say.

Example::

    mpsim trace summary traces/ --top 5
    mpsim trace summary rank0.json.gz --step 552 --json summary.json
    mpsim trace variation traces/

Each file is one rank's Kineto trace (``.json`` or ``.json.gz``); a folder stands for its
trace files. Per rank it prints GPU busy and idle time by kernel category, the largest
GEMM shapes with their achieved TFLOP/s, the collectives with their nccl-tests bus
bandwidth and the overlap of compute with communication, for one step (``--step``) or as
the mean over the trace's ``ProfilerStep`` ranges (docs/trace-reading.md). ``variation``
prints each op kind's step-to-step kernel variation over all the traces given, as the
``--set variability.cv.KIND=...`` that ``mpsim run --samples`` takes (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import non_negative_int, positive_int


def _summary(args: argparse.Namespace) -> int:
    import json

    from mpsim.traces import load_traces
    from mpsim.traces.peers import peer_waits
    from mpsim.traces.report import format_summary, summary_dict
    from mpsim.traces.summary import summarize

    if args.json not in (None, "-"):
        from mpsim.paths import check_writable

        check_writable(args.json, "--json")
    traces = load_traces(args.traces)
    # collectives found on every rank of their group are also timed without their wait for peers
    peers = peer_waits(traces)
    summaries = [summarize(trace, args.step, peers.of(number)) for number, trace in enumerate(traces)]
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


def _variation(args: argparse.Namespace) -> int:
    from mpsim.errors import InputError
    from mpsim.traces import load_traces
    from mpsim.traces.variation import MIN_STEPS, kind_variation

    traces = load_traces(args.traces)
    devices = sorted({t.device_name or "an unnamed device" for t in traces})
    if len(devices) > 1:
        raise InputError(f"the traces ran on different devices ({', '.join(devices)}); give one device's traces",
                         field="TRACE")
    kinds = kind_variation(traces)
    if not kinds:
        raise InputError(f"no kernel repeats in {MIN_STEPS} ProfilerStep ranges or more: record more steps",
                         field="TRACE")
    print(f"step-to-step kernel variation on {devices[0]}, {len(traces)} trace(s)")
    print(f"  {'kind':<11} {'cv':>7} {'kernels':>8} {'launches':>9} {'time ms':>9}")
    for row in kinds.values():
        print(f"  {row.kind:<11} {row.cv:>7.4f} {row.groups:>8} {row.kernels:>9} {1e3 * row.seconds:>9.1f}")
    print("as overrides: " + " ".join(f"--set variability.cv.{row.kind}={row.cv:.4f}" for row in kinds.values()))
    if "collective" in kinds:
        print("note: a collective kernel's time includes its wait for the slowest peer, which the order statistics "
              "over replicas already model", file=sys.stderr)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``trace summary`` and ``trace variation`` to the command parser."""
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
    variation = actions.add_parser("variation", help="each op kind's step-to-step kernel variation (for --samples)")
    variation.add_argument("traces", nargs="+", metavar="TRACE",
                           help="trace files of one device (.json or .json.gz) or folders of them")
    variation.set_defaults(handler=_variation)
