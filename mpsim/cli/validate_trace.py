"""``mpsim validate --trace TRACE... SCENARIO``: a scenario's prediction against profiler traces.

Nothing is measured and torch is not needed: the traces (one Kineto file per rank, or
folders of them) are read, the scenario is simulated, and the two are lined up by
``mpsim/traces/compare.py``. ``--trace`` takes every file that follows it, so the last
one is the scenario unless it is given before ``--trace`` or as ``--scenario``.
"""

from __future__ import annotations

import argparse
import sys

from mpsim.errors import InputError


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """The options of the trace comparison, on the ``validate`` parser."""
    parser.add_argument("trace_scenario", nargs="?", metavar="SCENARIO",
                        help="with --trace: the scenario the traces ran (or give it last, after the traces)")
    parser.add_argument("--trace", nargs="+", metavar="TRACE",
                        help="compare SCENARIO with these PyTorch profiler traces (.json or .json.gz, one per rank, "
                             "or folders of them) instead of measuring: per microbatch pass where the traces "
                             "annotate passes, else GPU time per kernel category; needs no torch")


def _split(args: argparse.Namespace) -> tuple[list[str], str]:
    traces = list(args.trace or [])
    if not traces:
        raise InputError("a SCENARIO argument is read only with --trace (the measured job's scenario is --scenario)",
                         field="SCENARIO")
    scenario = args.trace_scenario or args.scenario
    if scenario is None:
        if len(traces) < 2:
            raise InputError("give the scenario after the traces: mpsim validate --trace TRACE... SCENARIO",
                             field="--trace")
        scenario = traces.pop()
    return traces, scenario


def validate_trace(args: argparse.Namespace) -> int:
    from mpsim.simulate import simulate
    from mpsim.specs import load_scenario
    from mpsim.traces.compare import compare_traces
    from mpsim.traces.compare_report import format_comparison
    from mpsim.traces.read import load_traces

    traces, scenario = _split(args)
    for option, value in (("--out", args.out), ("--system", args.system)):
        if value:
            raise InputError("applies to the measured job; with --trace nothing is measured", field=option)
    loaded = load_scenario(scenario, args.overrides)
    try:
        result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None)
    except InputError as exc:
        if exc.field and exc.field.startswith("--"):
            raise
        raise loaded.origins.locate(exc) from None
    comparison = compare_traces(load_traces(traces, cpu_only=True, field="--trace"), result)
    if args.plot:
        from mpsim.traces.compare_plot import plot_comparison

        plot_comparison(comparison, args.plot)
        print(f"measured and predicted timelines written to {args.plot}", file=sys.stderr)
    print(format_comparison(comparison))
    return 0
