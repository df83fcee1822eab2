"""``mpsim compare``: one scenario under several pipeline schedules, side by side."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import add_scenario_args, schedule_list
from mpsim.errors import EXIT_OUT_OF_MEMORY, InputError


def schedule_vpp(name: str, vpp: int) -> int:
    """The chunks per rank a schedule runs with: the scenario's if it fits, else its requirement."""
    from mpsim.schedules import SCHEDULES, canonical_name

    kind = SCHEDULES[canonical_name(name)]
    if kind.max_vpp is not None and vpp > kind.max_vpp:
        return kind.max_vpp
    return max(vpp, kind.min_vpp)


def _compare(args: argparse.Namespace) -> int:
    from mpsim.results import summarize
    from mpsim.schedules import canonical_name
    from mpsim.simulate import bubble_reference, simulate
    from mpsim.specs import load_scenario

    names = schedule_list(args.schedules)
    base = load_scenario(args.scenario, args.overrides)
    rows, panels, references = [], [], []
    for name in names:
        vpp = schedule_vpp(name, base.scenario.parallel.vpp)
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
    else:
        _print_table(base.scenario.name, rows)
    if args.plot and panels:
        from mpsim.results.plot import plot_timelines

        plot_timelines(panels, args.plot, references)
        print(f"timelines written to {args.plot}", file=sys.stderr)
    ran = [summary for _, _, summary in rows if not isinstance(summary, str)]
    if not ran:
        raise InputError(f"no schedule could run: {rows[0][2].removeprefix('cannot run: ')}")
    return EXIT_OUT_OF_MEMORY if all(summary.out_of_memory for summary in ran) else 0


def _print_json(name: str, rows: list) -> None:
    """One JSON object: the scenario and, per schedule, its summary (docs/json.md) or why it could not run."""
    import json

    from mpsim.results.report import summary_dict

    body = [{"schedule": schedule, "vpp": vpp,
             **({"error": summary.removeprefix("cannot run: ")} if isinstance(summary, str) else
                {"summary": summary_dict(summary)})} for schedule, vpp, summary in rows]
    print(json.dumps({"scenario": name, "schedules": body}, indent=2))


def _print_table(name: str, rows: list) -> None:
    from mpsim.units import format_bytes, format_seconds

    header = (f"{'schedule':<18} {'vpp':>3} {'step time':>11} {'bubble':>7} {'ZB rate':>7} {'imbalance':>10} "
              f"{'PP comm':>9} {'MFU':>6} {'peak memory':>12}")
    print(name)
    print(header)
    for name, vpp, summary in rows:
        if isinstance(summary, str):
            print(f"{name:<18} {vpp:>3} {summary}")
            continue
        memory = max(m.peak_memory_bytes for m in summary.memory)
        print(f"{name:<18} {vpp:>3} {format_seconds(summary.step_time_s):>11} {100 * summary.bubble_fraction:6.1f}% "
              f"{100 * summary.bubble_rate_zb:6.1f}% {format_seconds(summary.bubble_imbalance_s):>10} "
              f"{format_seconds(summary.exposed_pp_comm_s):>9} {100 * summary.mfu:5.1f}% {format_bytes(memory):>12}"
              f"{'  OUT OF MEMORY' if summary.out_of_memory else ''}")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``compare`` to the command parser."""
    parser = commands.add_parser("compare", help="simulate a scenario under several schedules, side by side")
    add_scenario_args(parser)
    parser.add_argument("--schedules", required=True, metavar="A,B,...",
                        help="comma-separated schedule names, e.g. 1f1b,zb-h1,zbv")
    parser.add_argument("--plot", metavar="FILE", help="write the timelines one above the other")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: each schedule's summary (docs/json.md) or why it cannot run")
    parser.set_defaults(handler=_compare)
