"""``mpsim plan``: find the best layouts of a model on a cluster, and say why the others lose."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import no_layout_exit, positive_int, schedule_list
from mpsim.cli.sweep import add_execution_args, add_plot_args, check_backend, interrupted
from mpsim.errors import InputError


def _find_filter(text: str) -> dict[str, str]:
    """``tp=8,pp=16`` (or spaces) -> {'tp': '8', 'pp': '16'}."""
    wanted = {}
    for part in text.replace(",", " ").split():
        if "=" not in part:
            raise InputError("expected NAME=VALUE pairs like tp=8,pp=16,dp=128", f"--find {text}")
        name, value = part.split("=", 1)
        wanted[name.strip()] = value.strip()
    return wanted


def plan_json(result, top: int, finds: list[dict[str, str]]) -> str:
    """The plan as one JSON object: counts by status, the best layouts (each its point and
    metrics), why the others lost, and where each ``--find`` landed."""
    import json

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
    return json.dumps(body, indent=2, default=str)


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
    try:
        result = plan(scenario, top=args.top, pinned=pinned, max_microbatch_size=args.max_microbatch,
                      max_vpp=args.max_vpp, schedules=schedules, max_cp=args.max_cp, zero_stages=zero_stages,
                      engine=args.engine, prune=not args.no_prune,
                      backend=args.backend, workers=args.workers, ray_address=args.ray_address, out=args.out,
                      progress=args.progress)
    except KeyboardInterrupt:
        return interrupted(args.out)
    if args.json:
        print(plan_json(result, args.top, finds))
        winners = ranked(result)
        _plots(args, result, winners)
        return 0 if winners else no_layout_exit(result.records)
    print(format_plan(result, args.top))
    for wanted in finds:
        found = matching(result, wanted)
        print(f"\nwhere {' '.join(f'{k}={v}' for k, v in wanted.items())} landed ({len(found)} layouts):")
        for where, record in found[:args.top]:
            print(f"  {layout_label(record['point'])}: {where}")
        if not found:
            print("  no enumerated layout matches")
    winners = ranked(result)
    _plots(args, result, winners)
    return 0 if winners else no_layout_exit(result.records)



def _plots(args: argparse.Namespace, result, winners: list[dict]) -> None:
    from mpsim.explore import plots
    from mpsim.explore.planner import layout_label

    def label(record: dict) -> str:
        return layout_label(record["point"])

    if args.heatmap:
        plots.heatmap(result.records, "parallel.tp", "parallel.pp", args.heatmap,
                      title="tokens/s of the best layout for each tp and pp")
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
    parser.add_argument("model", help="model file or name, e.g. gpt3-175b or scenarios/models/gpt3_175b.yaml")
    parser.add_argument("--cluster", metavar="SYSTEM", help="system file or name, e.g. dgx-a100")
    parser.add_argument("--devices", type=positive_int, metavar="N", help="accelerators in the job")
    parser.add_argument("--global-batch", type=positive_int, metavar="B", help="sequences per optimizer step")
    parser.add_argument("--seq", type=positive_int, metavar="S", help="sequence length (default: the model file's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="fix a field (not enumerated), e.g. --set parallel.tp=8 or --set training.attention=flash")
    parser.add_argument("--top", type=positive_int, default=10, metavar="N", help="layouts to show (default 10)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: counts, the best layouts with their metrics, why the rest lost")
    parser.add_argument("--find", action="append", default=[], metavar="tp=8,pp=16,...",
                        help="also say where matching layouts landed and why (repeatable)")
    parser.add_argument("--max-microbatch", type=positive_int, default=8, metavar="N", help="largest microbatch (default 8)")
    parser.add_argument("--max-vpp", type=positive_int, default=8, metavar="N", help="most model chunks per rank (default 8)")
    parser.add_argument("--schedules", metavar="A,B", help="only these schedules (default: every registered one but the searched zb-1p and zb-2p)")
    parser.add_argument("--max-cp", type=positive_int, default=1, metavar="N",
                        help="search context parallelism up to N (default 1: off; it pays at long sequences)")
    parser.add_argument("--zero-stages", default="0,1", metavar="S,S",
                        help="ZeRO stages to search (default 0,1; 2 and 3 trade time for memory)")
    parser.add_argument("--no-prune", action="store_true",
                        help="simulate every layout that fits instead of stopping at the step-time bound")
    add_execution_args(parser)
    add_plot_args(parser, sweep=False)
    parser.set_defaults(handler=_plan)
