"""``mpsim plan``: find the best layouts of a model on a cluster, and say why the others lose."""

from __future__ import annotations

import argparse
import json
import sys

from mpsim.cli.common import (add_csv_arg, csv_to_stdout, no_layout_exit, non_negative_int, positive_int, sample_count,
                              schedule_list, token_count, write_csv)
from mpsim.cli.completion import complete_scenario_field, complete_schedules, names_completer
from mpsim.cli.sweep import add_execution_args, add_plot_args, check_backend, interrupted
from mpsim.errors import InputError


def _find_filter(text: str) -> dict[str, str]:
    """``tp=8,pp=16`` (or spaces) -> {'tp': '8', 'pp': '16'}."""
    from mpsim.errors import did_you_mean
    from mpsim.explore.planreport import SHORT_NAMES

    wanted = {}
    for part in text.replace(",", " ").split():
        if "=" not in part:
            raise InputError("expected NAME=VALUE pairs like tp=8,pp=16,dp=128", f"--find {text}")
        name, value = part.split("=", 1)
        if name.strip() not in SHORT_NAMES:
            hint = did_you_mean(name.strip(), list(SHORT_NAMES)) or f"use one of {', '.join(SHORT_NAMES)}"
            raise InputError(f"no layout has a {name.strip()!r}; {hint}", f"--find {text}")
        wanted[name.strip()] = value.strip()
    return wanted


def plan_dict(result, top: int, finds: list[dict[str, str]]) -> dict:
    """The object ``mpsim plan --json`` prints: counts by status, the best layouts (each its
    point and metrics), why the others lost, and where each ``--find`` landed."""
    from mpsim.explore.planreport import explain_losses, matching, ranked, status_counts

    winners = ranked(result)
    body = {
        "model": result.scenario.model.name, "system": result.scenario.cluster.system.name,
        "devices": result.scenario.cluster.devices,
        "global_batch_size": result.scenario.parallel.global_batch_size,
        "layouts": len(result.points), "status_counts": dict(sorted(status_counts(result).items())),
        "elapsed_s": result.elapsed_s,
        "best": [{"rank": i, "point": r["point"], "metrics": r["metrics"]} for i, r in enumerate(winners[:top], 1)],
        "losses": [{"reason": loss.reason, "count": loss.count, "example": loss.example["point"],
                    "detail": loss.detail} for loss in explain_losses(result, top)],
        "found": [{"filter": wanted, "layouts": [{"where": where, "point": record["point"]}
                                                 for where, record in matching(result, wanted)[:top]]}
                  for wanted in finds],
    }
    return body


# (column, parallel.* field of the point, metric to fall back on, value when neither has it);
# the layout columns of the printed table of the best layouts, by the field's own name
LAYOUT_COLUMNS = [("tp", "tp", "tp", 1), ("cp", "cp", None, 1), ("ep", "ep", None, 1), ("pp", "pp", "pp", 1),
                  ("dp", None, "dp", None), ("vpp", None, "vpp", None),
                  ("microbatch_size", None, "microbatch_size", None), ("schedule", None, "schedule", None),
                  ("sequence_parallel", "sequence_parallel", None, False), ("zero_stage", "zero_stage", None, 0),
                  ("recompute", "recompute", None, None)]
METRIC_COLUMNS = ["step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "peak_memory_bytes"]
CSV_COLUMNS = ["rank"] + [name for name, *_ in LAYOUT_COLUMNS] + METRIC_COLUMNS


def csv_rows(body: dict) -> list[dict]:
    """The best layouts (the printed table of them) for ``--csv``, read from the ``--json``
    object's ``best`` so the two agree."""
    rows = []
    for entry in body["best"]:
        point, metrics = entry["point"], entry["metrics"]
        row = {"rank": entry["rank"]}
        for name, field, metric, default in LAYOUT_COLUMNS:
            value = point.get(f"parallel.{field}") if field else None
            if value is None and metric is not None:
                value = metrics.get(metric)
            row[name] = default if value is None else value
        row.update({name: metrics.get(name) for name in METRIC_COLUMNS})
        rows.append(row)
    return rows


def _warn_of_a_partial_domain(scenario, devices: int) -> None:
    """The job-wide part of ``mpsim run``'s placement warning, on stderr before planning: every
    layout of a job that leaves part of a scale-up domain (a 72-GPU NVL72 rack) unused shares it.
    Groups that straddle domains depend on the layout; each is priced as its slowest copy."""
    from mpsim.cost.topology import placement_warnings

    system = scenario.cluster.system
    for line in placement_warnings(devices, system.devices_per_node, system.name, {}):
        print(f"warning: {line}", file=sys.stderr)


def _plan(args: argparse.Namespace) -> int:
    from mpsim.explore.planbase import base_scenario
    from mpsim.explore.planner import layout_label, plan
    from mpsim.explore.planreport import format_plan, matching, ranked
    from mpsim.specs.loader import parse_override

    check_backend(args)
    for name, value in (("--cluster", args.cluster), ("--devices", args.devices),
                        ("--global-batch", args.global_batch)):
        if value is None:
            raise InputError("required: mpsim plan MODEL --cluster SYSTEM --devices N --global-batch B", name)
    if args.top < 1:
        raise InputError("must be 1 or more", "--top")
    for option, given in (("--rank-by", args.rank_by != "step-time"), ("--samples", args.samples is not None),
                          ("--seed", args.seed is not None)):
        if given and args.tokens is None:
            raise InputError("needs --tokens T, the tokens to train", option)
    finds = [_find_filter(text) for text in args.find]
    scenario = base_scenario(args.model, args.cluster, args.devices, args.global_batch, args.seq, args.overrides)
    pinned = [".".join(parse_override(text)[0]) for text in args.overrides]
    schedules = schedule_list(args.schedules) if args.schedules is not None else []
    try:
        zero_stages = sorted({int(s) for s in args.zero_stages.split(",") if s.strip()})
    except ValueError:
        raise InputError("expected stages like 0,1,2,3", "--zero-stages") from None
    if not zero_stages or not set(zero_stages) <= {0, 1, 2, 3}:
        raise InputError("expected stages among 0,1,2,3", "--zero-stages")
    if args.max_cp < 1:
        raise InputError("must be 1 or more", "--max-cp")
    _check_before_planning(args, scenario, pinned, schedules)
    _warn_of_a_partial_domain(scenario, args.devices)
    try:
        result = plan(scenario, top=args.top, pinned=pinned, max_microbatch_size=args.max_microbatch,
                      max_vpp=args.max_vpp, schedules=schedules, max_cp=args.max_cp, zero_stages=zero_stages,
                      engine=args.engine, prune=not args.no_prune,
                      backend=args.backend, workers=args.workers, ray_address=args.ray_address, out=args.out,
                      progress=args.progress)
    except KeyboardInterrupt:
        return interrupted(args.out)
    trains = _time_to_train(args, result) if args.tokens is not None else None
    if args.json:
        body = plan_dict(result, args.top, finds)
        if trains is not None:
            body["time_to_train"] = trains
        print(json.dumps(body, indent=2, default=str))
    elif not csv_to_stdout(args):
        print(format_plan(result, args.top))
        for wanted in finds:
            found = matching(result, wanted)
            print(f"\nwhere {' '.join(f'{k}={v}' for k, v in wanted.items())} landed ({len(found)} layouts):")
            for where, record in found[:args.top]:
                print(f"  {layout_label(record['point'])}: {where}")
            if not found:
                print("  no enumerated layout matches")
        if trains is not None:
            print(format_time_to_train(trains, args))
    if args.csv:
        write_csv(args.csv, CSV_COLUMNS, csv_rows(plan_dict(result, args.top, finds)))
    winners = ranked(result)
    _plots(args, result, winners)
    if args.report:
        _report(args, result)
    return 0 if winners else no_layout_exit(result.records)



# the layouts re-simulated to rank by time to train: the fastest by step time, this many
# times --top (a slower step can win only through its data-parallel tail)
TRAIN_POOL = 3


def _check_before_planning(args: argparse.Namespace, scenario, pinned: list[str], schedules: list[str]) -> None:
    """What would fail after the search, or quietly narrow it, refused before it starts: a
    pinned schedule that --schedules leaves out, and what --tokens and --samples need."""
    from mpsim.schedules import canonical_name

    if "parallel.schedule" in pinned and schedules:
        chosen = canonical_name(scenario.parallel.schedule)
        if chosen not in {canonical_name(name) for name in schedules}:
            raise InputError(f"does not include {chosen}, which --set parallel.schedule pins; give one of the two",
                             "--schedules")
    if args.tokens is not None:
        from mpsim.reliability.goodput import check_goodput_inputs

        check_goodput_inputs(scenario, args.tokens, option="--tokens")
    if args.samples is not None:
        from mpsim.reliability.op_variation import op_cvs

        op_cvs(scenario)


def _time_to_train(args: argparse.Namespace, result) -> list[dict]:
    """Expected days to train --tokens for the fastest layouts by step time, each simulated
    again with its failures, checkpoints and restarts (and its step-time distribution with
    --samples), best first by --rank-by."""
    from mpsim.explore.planbase import apply_fields
    from mpsim.explore.planner import layout_label
    from mpsim.explore.planreport import ranked
    from mpsim.reliability.whole_run import whole_run
    from mpsim.simulate import simulate

    rows = []
    pool = ranked(result)[:args.top * (TRAIN_POOL if args.rank_by == "time-to-train" else 1)]
    for position, record in enumerate(pool, 1):
        asked = whole_run(simulate(apply_fields(result.scenario, record["point"])), args.samples, args.seed,
                          args.tokens)
        run = asked.goodput
        rows.append({"step_rank": position, "point": record["point"], "label": layout_label(record["point"]),
                     "step_time_s": run.step_time_s, "days": run.days,
                     "effective_training_time": run.run.effective_fraction,
                     "interruptions_per_day": run.interruptions_per_day})
    if args.rank_by == "time-to-train":
        rows.sort(key=lambda row: (row["days"], row["step_rank"]))
    return rows[:args.top]


def format_time_to_train(rows: list[dict], args: argparse.Namespace) -> str:
    step = "mean job step" if args.samples is not None else "step"
    lines = [f"\ntime to train {args.tokens:.4g} tokens with failures, checkpoints and restarts "
             f"(docs/reliability.md), ranked by {args.rank_by}:",
             f"  {'by step':>7}  {step:>13}  {'days':>8}  {'effective':>9}  layout"]
    for row in rows:
        lines.append(f"  {row['step_rank']:>7}  {row['step_time_s']:>12.4g}s  {row['days']:>8.2f}  "
                     f"{100 * row['effective_training_time']:>8.1f}%  {row['label']}")
    return "\n".join(lines)


def _report(args: argparse.Namespace, result) -> None:
    """The plan's HTML report: the layouts it simulated or found out of memory, and the best
    one's step in full."""
    from mpsim.explore.planbase import apply_fields
    from mpsim.explore.planreport import status_counts
    from mpsim.cli.report import simulate_for_report
    from mpsim.results.html.explore import write_records_report

    def best_run(point: dict):
        return simulate_for_report(apply_fields(result.scenario, point), [])

    counts = ", ".join(f"{count:,} {status}" for status, count in sorted(status_counts(result).items()))
    # the fields in the order the plan enumerates them (records read back from a results file
    # have their keys sorted), with the data-parallel size each layout leaves beside pp
    fields = list(dict.fromkeys(name for point in result.points for name, _ in point))
    if "parallel.pp" in fields:
        fields.insert(fields.index("parallel.pp") + 1, "parallel.dp")
    devices = result.scenario.cluster.devices

    def with_dp(record: dict) -> dict:
        point = record["point"]
        width = point.get("parallel.tp", 1) * point.get("parallel.cp", 1) * point.get("parallel.pp", 1)
        return {**record, "point": {**point, "parallel.dp": devices // width}}

    listed = [with_dp(r) for r in result.records if r is not None and r["status"] in ("ok", "oom")]
    scenario = result.scenario
    write_records_report(
        args.report, f"plan: {scenario.model.name} on {scenario.cluster.devices:,} x {scenario.cluster.system.name}",
        f"global batch {scenario.parallel.global_batch_size:,}, {len(result.points):,} layouts", listed, fields,
        best_run, f"Of {len(result.points):,} layouts: {counts}; the table lists those simulated and those found out "
                  "of memory.")
    print(f"report written to {args.report} (open it in a browser; it needs no network)", file=sys.stderr)


def _plots(args: argparse.Namespace, result, winners: list[dict]) -> None:
    from mpsim.explore import plots
    from mpsim.explore.planner import layout_label

    def label(record: dict) -> str:
        return layout_label(record["point"])

    if args.heatmap:
        plots.heatmap(result.records, "parallel.tp", "parallel.pp", args.heatmap,
                      title="throughput of the best layout that fits, for each tp and pp")
        print(f"heatmap written to {args.heatmap}", file=sys.stderr)
    if args.pareto:
        plots.pareto(result.records, args.pareto, label=label,
                     title="simulated layouts: throughput against memory (the bound skips most)")
        print(f"Pareto front written to {args.pareto}", file=sys.stderr)
    if args.breakdown:
        plots.breakdown(winners[:args.top], args.breakdown, label=label)
        print(f"step-time breakdown written to {args.breakdown}", file=sys.stderr)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``plan`` to the command parser."""
    parser = commands.add_parser(
        "plan", help="find the best parallel layouts of a model on a cluster",
        description="Enumerate every valid layout (tp, cp, pp, dp, ep, virtual stages, microbatch size, schedule, "
                    "recompute, sequence parallelism, ZeRO stage), drop those that do not fit in memory, simulate "
                    "the rest in order of a step-time lower bound, and print the best with why the others lost.")
    model = parser.add_argument("model", help="model file or name, e.g. gpt3-175b or scenarios/models/gpt3_175b.yaml")
    model.completer = names_completer("model")  # type: ignore[attr-defined]
    cluster = parser.add_argument("--cluster", metavar="SYSTEM", help="system file or name, e.g. dgx-a100")
    cluster.completer = names_completer("system")  # type: ignore[attr-defined]
    parser.add_argument("--devices", type=positive_int, metavar="N", help="accelerators in the job")
    parser.add_argument("--global-batch", type=positive_int, metavar="B", help="sequences per optimizer step")
    parser.add_argument("--seq", type=positive_int, metavar="S", help="sequence length (default: the model file's)")
    fixed = parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                                help="fix a field (not enumerated), e.g. --set parallel.tp=8 or --set "
                                     "training.attention=flash")
    fixed.completer = complete_scenario_field  # type: ignore[attr-defined]
    parser.add_argument("--top", type=positive_int, default=10, metavar="N", help="layouts to show (default 10)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: counts, the best layouts with their metrics, why the rest lost")
    add_csv_arg(parser, "the best layouts")
    parser.add_argument("--find", action="append", default=[], metavar="tp=8,pp=16,...",
                        help="also say where matching layouts landed and why (repeatable)")
    parser.add_argument("--max-microbatch", type=positive_int, default=8, metavar="N", help="largest microbatch (default 8)")
    parser.add_argument("--max-vpp", type=positive_int, default=8, metavar="N", help="most model chunks per rank (default 8)")
    schedules = parser.add_argument("--schedules", metavar="A,B", help="only these schedules (default: every registered one but the searched zb-1p and zb-2p)")
    schedules.completer = complete_schedules  # type: ignore[attr-defined]
    parser.add_argument("--max-cp", type=positive_int, default=1, metavar="N",
                        help="search context parallelism up to N (default 1: off; it pays at long sequences)")
    parser.add_argument("--zero-stages", default="0,1", metavar="S,S",
                        help="ZeRO stages to search (default 0,1; 2 and 3 trade time for memory)")
    parser.add_argument("--tokens", type=token_count, metavar="T",
                        help="also give the expected days to train T tokens with failures, checkpoints and restarts "
                             "for the best layouts (the scenario's reliability block; docs/reliability.md)")
    parser.add_argument("--rank-by", choices=("step-time", "time-to-train"), default="step-time",
                        help="order of the --tokens table: step time (default) or expected time to train, over the "
                             f"{TRAIN_POOL} x --top fastest layouts")
    parser.add_argument("--samples", type=sample_count, metavar="N",
                        help="with --tokens: each layout's step is the mean of N draws of its slowest data-parallel "
                             "replica (variability.cv), so a wider data-parallel tail costs time")
    parser.add_argument("--seed", type=non_negative_int, metavar="S", help="seed of the --samples draws (default 0)")
    parser.add_argument("--no-prune", action="store_true",
                        help="simulate every layout that fits instead of stopping at the step-time bound")
    add_execution_args(parser)
    add_plot_args(parser, sweep=False)
    parser.set_defaults(handler=_plan)
