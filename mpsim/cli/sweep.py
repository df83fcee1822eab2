"""``mpsim sweep``: run a scenario over a grid (or zip) of field values, in parallel, resumably."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import (add_csv_arg, add_scenario_args, csv_to_stdout, no_layout_exit, non_negative_int,
                              positive_int, write_csv)
from mpsim.errors import EXIT_INTERRUPTED, InputError

# the table's metric columns, as the records' metrics (docs/explore.md)
# layout numbers every simulated point's metrics carry, which a heatmap may take as an axis
LAYOUT_METRICS = ("tp", "pp", "dp", "vpp", "microbatch_size", "num_microbatches", "global_batch_size", "devices")
METRIC_COLUMNS = ["step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "peak_memory_bytes", "out_of_memory"]


def add_execution_args(parser: argparse.ArgumentParser) -> None:
    """Where and how points run, and where results go (shared with ``mpsim plan``)."""
    group = parser.add_argument_group("execution")
    group.add_argument("--out", metavar="FILE.jsonl",
                       help="append one JSON record per point as it finishes; rerunning resumes (docs/explore.md)")
    group.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local: a process pool on this machine (default); ray: a Ray cluster")
    group.add_argument("--workers", type=positive_int, metavar="N", help="worker processes (default: all local cores)")
    group.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to join (default: start a local one)")
    group.add_argument("--engine", choices=("fast", "simpy"), default="fast",
                       help="fast: longest-path evaluation (same step time); simpy: the event engine")
    group.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar on stderr (default: when stderr is a terminal)")


def check_backend(args: argparse.Namespace) -> None:
    """Fail in one line, before any work, when Ray is asked for but not installed."""
    from mpsim.explore.pools import RAY_INSTALL_HINT, ray_available

    if args.backend == "ray" and not ray_available():
        raise InputError(RAY_INSTALL_HINT)
    if args.workers is not None and args.workers < 1:
        raise InputError("must be 1 or more", "--workers")


def interrupted(out: str | None) -> int:
    where = f"; finished points are in {out}, rerun the same command to continue" if out else ""
    print(f"interrupted{where}", file=sys.stderr)
    return EXIT_INTERRUPTED


def _sweep(args: argparse.Namespace) -> int:
    from mpsim.explore.sweep import format_sweep, run_sweep

    check_backend(args)
    if args.limit is not None and args.limit < 0:
        raise InputError("must be 0 or more", "--limit")
    _check_heatmap_args(args)
    try:
        result = run_sweep(args.scenario, args.sweep, args.zip, args.overrides, engine=args.engine,
                           backend=args.backend, workers=args.workers, ray_address=args.ray_address, out=args.out,
                           limit=args.limit, progress=args.progress, retry_failed=args.retry_failed)
    except KeyboardInterrupt:
        return interrupted(args.out)
    if not csv_to_stdout(args):
        print(format_sweep(result, args.sort, args.top))
    if args.csv:
        columns, rows = csv_table(result, args.sort, args.top)
        write_csv(args.csv, columns, rows)
    _plots(args, result)
    if args.report:
        _report(args, result)
    done = [r for r in result.report.records if r is not None]
    if done and all(r["status"] == "invalid" for r in done):
        return no_layout_exit(done)  # every point invalid: a typo in a field or a value, said in one line
    return 0


def _report(args: argparse.Namespace, result) -> None:
    """The sweep's HTML report, the best point that fits simulated again in full."""
    from mpsim.cli.report import simulate_for_report
    from mpsim.explore.axes import override_text
    from mpsim.results.html.explore import write_records_report

    def best_run(point: dict):
        return simulate_for_report(args.scenario, [*args.overrides,
                                                   *(override_text(name, value) for name, value in point.items())])

    fields = [name for axis in result.axes for name in axis.fields]
    write_records_report(args.report, f"sweep of {args.scenario}", f"{len(result.points):,} points over "
                         + ", ".join(fields), result.report.records, fields, best_run)
    print(f"report written to {args.report} (open it in a browser; it needs no network)", file=sys.stderr)


def csv_table(result, sort: str | None, top: int | None) -> tuple[list[str], list[dict]]:
    """The columns and rows of ``--csv``: the printed table's records in its order, each swept
    field by its full name, the metrics as the results file holds them, the status and the error."""
    from mpsim.explore.sweep import sweep_rows

    fields = [name for axis in result.axes for name in axis.fields]
    rows = []
    for record in sweep_rows(result, sort, top):
        metrics = record.get("metrics") or {}
        row = {name: _cell(record["point"].get(name)) for name in fields}
        row.update({name: metrics.get(name) for name in METRIC_COLUMNS} if record["status"] == "ok" else {})
        row.update(status=record["status"], error=record.get("error"))
        rows.append(row)
    return fields + METRIC_COLUMNS + ["status", "error"], rows


def _cell(value):
    """A swept value as a CSV cell: scalars as they are, lists and mappings as JSON."""
    import json

    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _check_heatmap_args(args: argparse.Namespace) -> None:
    """The heatmap's two fields are swept and its metric exists: said before the sweep runs,
    not after it (or in an empty picture)."""
    if not args.heatmap:
        return
    from mpsim.explore.evaluate import NUMERIC_METRICS
    from mpsim.explore.sweep import sweep_points

    if args.heatmap_metric not in NUMERIC_METRICS:
        raise InputError(f"unknown metric {args.heatmap_metric!r}; use one of {', '.join(NUMERIC_METRICS)}",
                         "--heatmap-metric")
    axes, _ = sweep_points(args.scenario, args.sweep, args.zip)
    fields = [name for axis in axes for name in axis.fields]
    chosen = args.heatmap_axes.split(",") if args.heatmap_axes else fields[:2]
    if len(chosen) != 2:
        raise InputError(f"needs two swept fields (swept: {', '.join(fields)}): give --heatmap-axes X,Y", "--heatmap")
    for name in chosen:
        # a swept field, or a layout number every simulated point reports (dp when tp and pp are swept)
        if name.strip() not in fields and name.strip().rsplit(".", 1)[-1] not in LAYOUT_METRICS:
            raise InputError(f"{name.strip()!r} is neither swept nor a layout number of the results; swept: "
                             f"{', '.join(fields)}", "--heatmap-axes")


def _plots(args: argparse.Namespace, result) -> None:
    from mpsim.explore import plots
    from mpsim.explore.sweep import sweep_rows

    records = result.report.records
    fields = [name for axis in result.axes for name in axis.fields]
    if args.heatmap:
        axes = args.heatmap_axes.split(",") if args.heatmap_axes else fields[:2]
        if len(axes) != 2:
            raise InputError("needs two swept fields: give --heatmap-axes X,Y", "--heatmap")
        plots.heatmap(records, axes[0], axes[1], args.heatmap, metric=args.heatmap_metric)
        print(f"heatmap written to {args.heatmap}", file=sys.stderr)
    if args.pareto:
        plots.pareto(records, args.pareto)
        print(f"Pareto front written to {args.pareto}", file=sys.stderr)
    if args.scaling:
        plots.scaling(records, args.scaling)
        print(f"scaling curve written to {args.scaling}", file=sys.stderr)
    if args.breakdown:
        simulated = [r for r in sweep_rows(result, "tokens_per_s") if r["status"] == "ok"]
        fitting = [r for r in simulated if not r["metrics"].get("out_of_memory")]
        best = (fitting + [r for r in simulated if r not in fitting])[:args.top or 8]
        plots.breakdown(best, args.breakdown)
        print(f"step-time breakdown written to {args.breakdown}", file=sys.stderr)


def add_plot_args(parser: argparse.ArgumentParser, sweep: bool) -> None:
    """Pictures of the results (shared with ``mpsim plan``)."""
    group = parser.add_argument_group("plots (.png, .svg, .pdf)")
    if sweep:
        group.add_argument("--heatmap", metavar="FILE", help="throughput over two swept fields")
        group.add_argument("--heatmap-axes", metavar="X,Y", help="the two fields (default: the first two swept)")
        group.add_argument("--heatmap-metric", default="tokens_per_s",
                           help="metric in the cells (default tokens_per_s; e.g. mfu, step_time_s)")
    else:
        group.add_argument("--heatmap", metavar="FILE", help="best throughput over tp and pp")
    group.add_argument("--pareto", metavar="FILE", help="throughput against peak memory, front named")
    parser.add_argument("--report", metavar="FILE",
                        help="write an interactive HTML report: every layout, and the best one's step in full")
    group.add_argument("--breakdown", metavar="FILE", help="step-time breakdown of the best points")
    if sweep:
        group.add_argument("--scaling", metavar="FILE", help="throughput against device count (sweep cluster.nodes)")


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``sweep`` to the command parser."""
    sweep = commands.add_parser(
        "sweep", help="run a scenario over a grid of field values (parallel, resumable)",
        description="Run a scenario over every combination of swept field values. Values: 1,2,4 or 1..8 "
                    "(inclusive, optional :STEP) or 2^0..3 (powers: 1,2,4,8) or names (dgx-a100,dgx-h100). "
                    "Invalid combinations are skipped and counted.")
    add_scenario_args(sweep)
    sweep.add_argument("--sweep", action="append", default=[], metavar="FIELD=VALUES",
                       help="a grid axis, e.g. parallel.tp=1,2,4,8 (repeatable; axes multiply)")
    sweep.add_argument("--zip", action="append", default=[], metavar="FIELD=VALUES",
                       help="fields that vary together, e.g. --zip cluster.system=dgx-a100,dgx-h100 "
                            "--zip cluster.nodes=16,8 (all --zip fields form one axis)")
    sweep.add_argument("--limit", type=non_negative_int, metavar="N", help="compute at most N new points, then stop")
    sweep.add_argument("--retry-failed", action="store_true", help="recompute points recorded as failed")
    sweep.add_argument("--sort", metavar="METRIC", help="sort the table: tokens_per_s, mfu, step_time_s, "
                                                         "peak_memory_bytes")
    sweep.add_argument("--top", type=positive_int, metavar="N", help="show only the first N rows")
    add_csv_arg(sweep)
    add_execution_args(sweep)
    add_plot_args(sweep, sweep=True)
    sweep.set_defaults(handler=_sweep)
