"""``mpsim validate``: run a small model with PyTorch's pipeline schedules and compare mpsim with it."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.calibrate import add_measure_args
from mpsim.cli.common import check_profile_path, non_negative_int, positive_int
from mpsim.errors import InputError


def _validate(args: argparse.Namespace) -> int:
    if args.trace or args.trace_scenario:  # profiler traces against a scenario: no torch, nothing measured
        from mpsim.cli.validate_trace import validate_trace

        return validate_trace(args)
    check_profile_path(args.out, "--out")
    from mpsim.calibrate import require_torch
    from mpsim.calibrate.measure.jobs import MeasureSettings
    from mpsim.calibrate.measure.launch import JobError
    from mpsim.specs.calibration import write_profile
    from mpsim.calibrate.check.report import format_validation
    from mpsim.calibrate.runner import validate

    require_torch()
    if args.steps < 1 or args.warmup < 0:
        raise InputError("give --steps 1 or more and --warmup 0 or more", "--steps")
    if args.ranks is not None and args.ranks < 1:
        raise InputError("must be 1 or more", "--ranks")
    schedules = [name.strip() for name in args.schedules.split(",") if name.strip()]
    settings = MeasureSettings(warmup_steps=args.warmup, steps=args.steps)
    say = (lambda text: print(text, file=sys.stderr))
    try:
        outcome = validate(args.device, schedules, settings, scenario_ref=args.scenario, overrides=args.overrides,
                           system=args.system, ranks=args.ranks, wait_s=args.wait, allow_busy=args.allow_busy,
                           timeout_s=args.timeout, say=say)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        write_profile(outcome.profile, args.out)
        print(f"profile (with the fit) written to {args.out}", file=sys.stderr)
    if args.plot:
        from mpsim.calibrate.check.plot import plot_validation

        plot_validation(outcome.checks, args.plot)
        print(f"measured and simulated timelines written to {args.plot}", file=sys.stderr)
    print(format_validation(outcome))
    if outcome.fit_problems:
        print(f"error: the fit is out of its sensible range: {'; '.join(outcome.fit_problems)}; the predictions "
              f"above rest on it", file=sys.stderr)
        return 1
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``validate`` to the command parser."""
    from mpsim.calibrate.measure.jobs import DEFAULT_SCHEDULES
    from mpsim.cli.validate_trace import add_trace_args

    parser = commands.add_parser(
        "validate", help="train a small model with PyTorch's pipeline schedules and compare mpsim's predictions")
    add_measure_args(parser)
    parser.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES), metavar="A,B,...",
                        help=f"schedules to run (default {','.join(DEFAULT_SCHEDULES)}; 1f1b, the fit schedule, "
                             f"is always run)")
    parser.add_argument("--steps", type=positive_int, default=5, help="measured steps per schedule (default 5)")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="warm-up steps per schedule (default 1)")
    parser.add_argument("--scenario", metavar="FILE",
                        help="the job to run and simulate (default scenarios/validation_2xcpu.yaml)")
    parser.add_argument("--system", metavar="NAME",
                        help="hardware file of the device (default local-cpu on cpu, hgx-h200 on cuda)")
    parser.add_argument("--out", metavar="PROFILE", help="write the measured profile, with its fit, here")
    parser.add_argument("--plot", metavar="FILE", help="write the measured and simulated timelines (.png, .svg)")
    add_trace_args(parser)
    parser.set_defaults(handler=_validate)
