"""``mpsim calibrate``: measure this machine's ops and links with PyTorch, fit them on a real training job,
and write the calibration profile (the same profile ``mpsim validate --out`` writes)."""

from __future__ import annotations

import argparse
import sys

from mpsim.cli.common import check_profile_path, positive_int
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
                        help="how long to wait for a busy machine to quiet down before refusing (default 60 s; "
                             "not with --allow-busy)")
    parser.add_argument("--allow-busy", action="store_true",
                        help="measure at once, without waiting for a busy machine (--wait is skipped): a training "
                             "step none of whose tries was quiet keeps its least disturbed try instead of being "
                             "dropped, and once the job's pauses for quiet are used up nothing is tried again; the "
                             "numbers, and how disturbed they were, are flagged in the report")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="stop the measurement job after this long (default 1800 s)")


def _calibrate(args: argparse.Namespace) -> int:
    check_profile_path(args.out, "--out")
    if args.from_trace is not None:  # fitting profiler traces measures nothing and needs no torch
        from mpsim.calibrate.from_trace import run_from_trace

        return run_from_trace(args)
    from mpsim.calibrate import require_torch
    from mpsim.calibrate.measure.jobs import MeasureSettings
    from mpsim.calibrate.measure.launch import JobError
    from mpsim.specs.calibration import write_profile
    from mpsim.calibrate.check.report import format_calibration
    from mpsim.calibrate.runner import calibrate

    for option, given in (("--system", args.system), ("--accelerator", args.accelerator)):
        if given is not None:  # they say what a trace's kernels ran on; a measurement finds its own device
            raise InputError("only with --from-trace: measuring this machine prices its own device", option)
    require_torch()
    if args.ranks is not None and args.ranks < 1:
        raise InputError("must be 1 or more", "--ranks")
    say = (lambda text: print(text, file=sys.stderr))
    try:
        outcome = calibrate(args.device, args.scenario, args.overrides, MeasureSettings(warmup_steps=1, steps=5),
                            ranks=args.ranks, wait_s=args.wait, allow_busy=args.allow_busy, timeout_s=args.timeout,
                            say=say)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    profile = outcome.profile
    if args.out:
        write_profile(profile, args.out)
        print(format_calibration(profile, outcome.fit_problems))
        print(f"profile written to {args.out}; name it from a scenario as `calibration: {args.out}`")
    else:
        import yaml

        print(format_calibration(profile, outcome.fit_problems), file=sys.stderr)
        print(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, width=120), end="")
    if outcome.fit_problems:
        print(f"error: the fit is out of its sensible range: {'; '.join(outcome.fit_problems)}; the measurements "
              f"are not fit to predict with (a busy machine, or ops the job runs unlike their microbenchmarks)",
              file=sys.stderr)
        return 1
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` to the command parser."""
    parser = commands.add_parser(
        "calibrate", help="measure this machine's ops and links with PyTorch into a calibration profile")
    parser.add_argument("scenario", nargs="?",
                        help="scenario whose ops to measure (default: the validation scenario for --device)")
    add_measure_args(parser)
    parser.add_argument("-o", "--out", metavar="PROFILE", help="write the profile here (.yaml or .json); "
                                                         "without it the profile is printed as YAML")
    parser.add_argument("--from-trace", nargs="+", metavar="TRACE",
                        help="fit the profile to PyTorch profiler (Kineto) traces of a real run instead of measuring "
                             "(.json or .json.gz files, or folders of them); needs --system")
    parser.add_argument("--system", metavar="SYSTEM",
                        help="with --from-trace: the system whose accelerator and links price the datasheet model")
    parser.add_argument("--accelerator", metavar="NAME",
                        help="with --from-trace: the accelerator file of the traced device when it is not the "
                             "system's own (e.g. a100-sxm-40gb in dgx-a100)")
    parser.set_defaults(handler=_calibrate)
