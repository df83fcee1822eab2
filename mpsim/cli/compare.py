"""``mpsim compare``: one scenario under several pipeline schedules, side by side."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import (add_csv_arg, add_scenario_args, csv_to_stdout, resized_by_system, schedule_list,
                               write_csv)
from mpsim.cli.completion import complete_schedules
from mpsim.errors import EXIT_OUT_OF_MEMORY, InputError


def _compare(args: argparse.Namespace) -> int:
    from mpsim.results import summarize
    from mpsim.schedules import canonical_name, chunks_per_rank, schedule_names
    from mpsim.simulate import bubble_reference, simulate
    from mpsim.specs import load_scenario

    # without --schedules, every registered one: those the layout cannot run say why in their row
    names = schedule_list(args.schedules) if args.schedules is not None else schedule_names()
    base = load_scenario(args.scenario, args.overrides)
    rows, panels, references = [], [], []
    for name in names:
        vpp = chunks_per_rank(name, base.scenario.parallel.vpp)
        overrides = [*args.overrides, f"parallel.schedule={canonical_name(name)}", f"parallel.vpp={vpp}"]
        loaded = load_scenario(args.scenario, overrides)
        try:
            result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None)
        except InputError as exc:
            rows.append((name, vpp, f"cannot run: {loaded.origins.locate(exc)}"))
            continue
        reference = bubble_reference(result)
        summary = summarize(result, reference)
        rows.append((name, vpp, summary))
        panels.append((result, summary, f"{canonical_name(name)} (vpp {vpp})"))
        references.append(reference)
    if args.json:
        _print_json(base.scenario.name, rows)
    elif not csv_to_stdout(args):
        _print_table(base.scenario.name, rows)
    if args.csv:
        write_csv(args.csv, CSV_COLUMNS, csv_rows(rows))
    resized = resized_by_system(args.scenario, args.overrides, base.scenario)
    if resized:
        print(resized, file=sys.stderr)
    if args.report and panels:
        from mpsim.results.html import write_compare_report

        write_compare_report(args.report, base.scenario.name,
                             [(result, summary, reference, title) for (result, summary, title), reference
                              in zip(panels, references)], csv_rows(rows))
        print(f"report written to {args.report} (open it in a browser; it needs no network)", file=sys.stderr)
    if args.plot and panels:
        from mpsim.results.plot import plot_timelines

        plot_timelines(panels, args.plot, references)
        print(f"timelines written to {args.plot}", file=sys.stderr)
    ran = [summary for _, _, summary in rows if not isinstance(summary, str)]
    if not ran:
        raise InputError(f"no schedule could run: {rows[0][2].removeprefix('cannot run: ')}")
    return EXIT_OUT_OF_MEMORY if all(summary.out_of_memory for summary in ran) else 0


def json_rows(rows: list) -> list[dict]:
    """Per schedule: its name, vpp and summary (docs/json.md) or why it could not run."""
    from mpsim.results.report import summary_dict

    return [{"schedule": schedule, "vpp": vpp,
             **({"error": summary.removeprefix("cannot run: ")} if isinstance(summary, str) else
                {"summary": summary_dict(summary)})} for schedule, vpp, summary in rows]


def _print_json(name: str, rows: list) -> None:
    """One JSON object: the scenario and, per schedule, its summary (docs/json.md) or why it could not run."""
    import json

    print(json.dumps({"scenario": name, "schedules": json_rows(rows)}, indent=2))


# the columns of the table, as summary fields of docs/json.md (peak memory: the busiest rank's)
SUMMARY_COLUMNS = ["step_time_s", "bubble_fraction", "bubble_rate_zb", "bubble_imbalance_s", "exposed_pp_comm_s",
                   "mfu", "peak_memory_bytes", "out_of_memory"]
CSV_COLUMNS = ["schedule", "vpp", *SUMMARY_COLUMNS, "error"]


def csv_rows(rows: list) -> list[dict]:
    """The table's rows for ``--csv``, read from the ``--json`` objects so the two agree."""
    table = []
    for entry in json_rows(rows):
        summary = entry.get("summary", {})
        table.append({"schedule": entry["schedule"], "vpp": entry["vpp"], "error": entry.get("error"),
                      **{name: summary.get(name) for name in SUMMARY_COLUMNS}})
    return table


def _print_table(name: str, rows: list) -> None:
    """The schedules side by side; throughput in the model's unit, a layout that does not fit marked OOM."""
    from mpsim.explore.tables import fmt_bytes, fmt_percent, fmt_rate, fmt_seconds, render_table
    from mpsim.results.throughput import rate_heading

    ran = [summary for _, _, summary in rows if not isinstance(summary, str)]
    body = []
    for schedule, vpp, summary in rows:
        if isinstance(summary, str):
            body.append([schedule, vpp] + ["-"] * 9 + [summary])
            continue
        body.append([schedule, vpp, fmt_seconds(summary.step_time_s), fmt_rate(summary.throughput_per_s),
                     fmt_percent(summary.bubble_fraction), fmt_percent(summary.bubble_rate_zb),
                     fmt_seconds(summary.bubble_imbalance_s), fmt_seconds(summary.exposed_pp_comm_s),
                     fmt_percent(summary.mfu), fmt_bytes(summary.peak_memory_bytes),
                     "OOM" if summary.out_of_memory else "yes", ""])
    print(name)
    print(render_table(["schedule", "vpp", "step time", rate_heading(s.throughput_unit for s in ran), "bubble",
                        "ZB rate", "imbalance", "PP comm", "MFU", "peak memory", "fits", "note"], body, indent=""))


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``compare`` to the command parser."""
    parser = commands.add_parser("compare", help="simulate a scenario under several schedules, side by side")
    add_scenario_args(parser)
    schedules = parser.add_argument("--schedules", metavar="A,B,...",
                                    help="comma-separated schedule names, e.g. 1f1b,zb-h1,zbv (default: every "
                                         "registered schedule; see mpsim list schedules)")
    schedules.completer = complete_schedules  # type: ignore[attr-defined]
    parser.add_argument("--plot", metavar="FILE", help="write the timelines one above the other")
    parser.add_argument("--report", metavar="FILE", help="write an interactive HTML report of the schedules")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: each schedule's summary (docs/json.md) or why it cannot run")
    add_csv_arg(parser)
    parser.set_defaults(handler=_compare)
