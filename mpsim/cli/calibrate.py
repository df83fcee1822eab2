"""``mpsim calibrate``: measure this machine's ops and links with PyTorch into a calibration profile."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import positive_int
from mpsim.errors import InputError


def add_measure_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``calibrate`` and ``validate``: device, ranks, and how to treat a busy machine."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="what to measure: CPU cores over gloo, or GPUs over NCCL (default cpu)")
    parser.add_argument("--ranks", type=positive_int, metavar="N",
                        help="processes to run (default: 2 on a CPU with 2 cores or more, every GPU on cuda)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field of the scenario measured (repeatable)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="S",
                        help="how long to wait for a busy machine to quiet down before refusing (default 60 s)")
    parser.add_argument("--allow-busy", action="store_true",
                        help="measure even when other processes still load the machine after --wait: a training "
                             "step none of whose tries was quiet keeps its least disturbed try instead of being "
                             "dropped, and once the job's pauses for quiet are used up nothing is tried again; the "
                             "numbers, and how disturbed they were, are flagged in the report")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="stop the measurement job after this long (default 1800 s)")


def _calibrate(args: argparse.Namespace) -> int:
    from mpsim.calibrate import require_torch
    from mpsim.calibrate.measure.jobs import MeasureSettings
    from mpsim.calibrate.measure.launch import JobError
    from mpsim.specs.calibration import write_profile
    from mpsim.calibrate.check.report import format_calibration
    from mpsim.calibrate.runner import calibrate

    require_torch()
    if args.ranks is not None and args.ranks < 1:
        raise InputError("must be 1 or more", "--ranks")
    say = (lambda text: print(text, file=sys.stderr))
    try:
        profile = calibrate(args.device, args.scenario, args.overrides, MeasureSettings(), ranks=args.ranks,
                            wait_s=args.wait, allow_busy=args.allow_busy, timeout_s=args.timeout, say=say)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        write_profile(profile, args.out)
        print(format_calibration(profile))
        print(f"profile written to {args.out}; name it from a scenario as `calibration: {args.out}`")
    else:
        import yaml

        print(format_calibration(profile), file=sys.stderr)
        print(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, width=120), end="")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` to the command parser."""
    parser = commands.add_parser(
        "calibrate", help="measure this machine's ops and links with PyTorch into a calibration profile")
    parser.add_argument("scenario", nargs="?",
                        help="scenario whose ops to measure (default: the validation scenario for --device)")
    add_measure_args(parser)
    parser.add_argument("--out", metavar="PROFILE", help="write the profile here (.yaml or .json); "
                                                         "without it the profile is printed as YAML")
    parser.set_defaults(handler=_calibrate)
