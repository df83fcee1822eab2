"""``mpsim run``: simulate one training step of a scenario."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import add_scenario_args
from mpsim.errors import InputError


def _run(args: argparse.Namespace) -> int:
    from mpsim.results import format_summary, summarize, summary_json
    from mpsim.simulate import bubble_reference, simulate
    from mpsim.specs import load_scenario

    loaded = load_scenario(args.scenario, args.overrides)
    try:
        result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None)
    except InputError as exc:
        raise loaded.origins.locate(exc) from None
    reference = bubble_reference(result)
    summary = summarize(result, reference)
    print(summary_json(summary) if args.json else format_summary(summary))
    if args.trace:
        from mpsim.results.trace import write_trace

        write_trace(result, args.trace, ops=not args.trace_actions_only, reference=reference)
        print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.plot:
        from mpsim.results.plot import plot_timeline

        plot_timeline(result, summary, args.plot, reference=reference)
        print(f"timeline written to {args.plot}", file=sys.stderr)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``run`` to the command parser."""
    run = commands.add_parser("run", help="simulate one training step of a scenario")
    add_scenario_args(run)
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object (docs/json.md)")
    run.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    run.add_argument("--trace-actions-only", action="store_true", help="trace whole actions, not every op")
    run.add_argument("--plot", metavar="FILE", help="write a timeline picture (.png, .svg, .pdf)")
    run.set_defaults(handler=_run)
