"""``mpsim report``: one simulated step as a self-contained, interactive HTML page."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import add_scenario_args
from mpsim.errors import EXIT_OUT_OF_MEMORY


def simulate_for_report(scenario, overrides: list[str]):
    """Load (a file, a shipped name or a ``Scenario``) and simulate as ``mpsim run`` does:
    (result, summary, bubble reference)."""
    from mpsim.api import simulate

    run = simulate(scenario, overrides)
    return run.simulation, run.summary, run.reference


def _report(args: argparse.Namespace) -> int:
    from mpsim.results.html import write_run_report

    result, summary, reference = simulate_for_report(args.scenario, args.overrides)
    write_run_report(args.output, result, summary, reference)
    print(f"report written to {args.output} (open it in a browser; it needs no network)", file=sys.stderr)
    return EXIT_OUT_OF_MEMORY if summary.out_of_memory else 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``report`` to the command parser."""
    report = commands.add_parser("report", help="write one step of a scenario as an interactive HTML report")
    add_scenario_args(report)
    report.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    report.set_defaults(handler=_report)
