"""``mpsim schedule``: print a generated schedule in the text form, or check a schedule file."""

from __future__ import annotations

import argparse
from pathlib import Path

from mpsim.cli.common import positive_int
from mpsim.errors import InputError


def _schedule(args: argparse.Namespace) -> int:
    from mpsim.engine import rank_spans
    from mpsim.schedules import ScheduleError, build_schedule, flat
    from mpsim.schedules.actions import ScheduleTextError, load_schedule_file
    from mpsim.schedules.validate import validate

    if args.name.startswith("file:") or Path(args.name).is_file():
        path = Path(args.name.removeprefix("file:"))
        if not path.is_file():
            raise InputError("schedule file not found", str(path))
        try:
            schedule = load_schedule_file(path)
            validate(schedule)
        except (ScheduleTextError, ScheduleError) as exc:
            raise InputError(str(exc), str(path)) from None
        actions = sum(len(flat(rank)) for rank in schedule.actions)
        pipelines = f"{len(schedule.chains)} pipelines, " if len(schedule.chains) > 1 else ""
        print(f"{path}: valid: {schedule.num_ranks} ranks, {pipelines}{schedule.num_stages} stages, "
              f"{schedule.num_microbatches} microbatches, {actions} actions")
        return 0
    from mpsim.schedules import unknown_schedule

    problem = unknown_schedule(args.name)
    if problem:
        # a name no schedule has, or a file path that is not there
        looks_like_file = args.name.endswith((".txt", ".yaml", ".json")) or "/" in args.name
        raise InputError("schedule file not found" if looks_like_file else problem, args.name)
    if args.pp is None or args.microbatches is None:
        raise InputError("give --pp and --microbatches to generate a schedule", args.name)
    try:
        schedule = build_schedule(args.name, args.pp, args.vpp, args.microbatches, check=True, timer=rank_spans,
                                  microbatch_group_size=args.microbatch_group_size,
                                  combined=args.overlap_moe_expert_parallel_comm)
    except ScheduleError as exc:
        # the registry speaks of the scenario's fields; here the options set them
        message = (str(exc).replace("parallel.vpp", "--vpp").replace("microbatch_group_size", "--microbatch-group-size")
                   .replace("parallel.schedule: ", "").replace("parallel.schedule", "the schedule"))
        raise InputError(message, args.name) from None
    text = schedule.to_text()
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``schedule`` to the command parser."""
    parser = commands.add_parser(
        "schedule", help="print a schedule's per-rank actions (torch.distributed.pipelining notation) or check a file")
    parser.add_argument("name", help="schedule name (e.g. zbv), or a schedule file to check")
    parser.add_argument("--pp", type=positive_int, help="pipeline ranks")
    parser.add_argument("--vpp", type=positive_int, default=1, help="chunks per rank (default 1)")
    parser.add_argument("--microbatches", type=positive_int, help="microbatches per step")
    parser.add_argument("--microbatch-group-size", type=positive_int, metavar="N",
                        help="interleaved-1f1b: microbatches each chunk runs in a row (Megatron-Core's "
                             "--microbatch-group-size-per-virtual-pipeline-stage; default pp)")
    parser.add_argument("--overlap-moe-expert-parallel-comm", action="store_true",
                        help="Megatron-Core's combined 1F1B: one forward more in the warm-up, then each forward "
                             "paired with a backward as one overlapped step (interleaved-1f1b, or 1f1b with --pp 1)")
    parser.add_argument("--out", metavar="FILE", help="write the text form to FILE instead of printing it")
    parser.set_defaults(handler=_schedule)
