"""Command line: argument parsing and printing only; the work happens in the library."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from mpsim.errors import EXIT_INPUT_ERROR, InputError


def _add_scenario_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario file (or the name of a shipped one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any field, e.g. --set parallel.tp=4 (repeatable)")


def _cmd_run(args: argparse.Namespace) -> int:
    from mpsim.results import format_summary, summarize, summary_json
    from mpsim.simulate import simulate
    from mpsim.specs import load_scenario

    loaded = load_scenario(args.scenario, args.overrides)
    try:
        result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None)
    except InputError as exc:
        raise loaded.origins.locate(exc) from None
    summary = summarize(result)
    print(summary_json(summary) if args.json else format_summary(summary))
    if args.trace:
        from mpsim.results.trace import write_trace

        write_trace(result, args.trace, ops=not args.trace_actions_only)
        print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev)", file=sys.stderr)
    if args.plot:
        from mpsim.results.plot import plot_timeline

        plot_timeline(result, summary, args.plot)
        print(f"timeline written to {args.plot}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``mpsim`` argument parser."""
    parser = argparse.ArgumentParser(prog="mpsim", description="Simulate model-parallel training before you run it.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="simulate one training step of a scenario")
    _add_scenario_args(run)
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object (docs/json.md)")
    run.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    run.add_argument("--trace-actions-only", action="store_true", help="trace whole actions, not every op")
    run.add_argument("--plot", metavar="FILE", help="write a timeline picture (.png, .svg, .pdf)")
    run.set_defaults(handler=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mpsim`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
