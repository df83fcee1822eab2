"""Calibrate on this machine, run PyTorch's pipeline schedules, report mpsim's errors.

One measurement job (``mpsim validate``): the ops and links of the validation
scenario, then GPipe, 1F1B, interleaved 1F1B, ZB-V and DualPipeV on 2 ranks of one
thread, then the DTensor TP = 2 against TP = 1 MLP check. The profile is fitted on
1F1B (an efficiency multiplier and a per-action overhead) and checked on the other
schedules. Prints the report with the fitted parameters and whether they are in their
sensible ranges; the goal is a median absolute step-time error of 5 % or less and a
maximum of 10 %. The last line is
``median_abs_error_pct=<x> max_abs_error_pct=<y> schedules=<n>``.

Usage: python benchmarks/calibration_report.py [--device cpu|cuda] [--steps N]
       [--plot FILE] [--out PROFILE] [--allow-busy]
Needs torch (pip install 'mpsim[calibrate]') and a quiet machine: it waits for other
processes to leave the CPU alone and refuses to measure under load unless told to.
"""

from __future__ import annotations

import argparse
import sys

from mpsim.calibrate.check.compare import step_errors
from mpsim.calibrate.measure.jobs import DEFAULT_SCHEDULES, MeasureSettings
from mpsim.calibrate.measure.launch import JobError
from mpsim.calibrate.check.plot import plot_validation
from mpsim.specs.calibration import write_profile
from mpsim.calibrate.check.report import format_validation
from mpsim.calibrate.runner import validate
from mpsim.errors import InputError

GOAL_MEDIAN_PCT, GOAL_MAX_PCT = 5.0, 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--schedules", default=",".join(DEFAULT_SCHEDULES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--plot", metavar="FILE", help="measured and simulated timelines")
    parser.add_argument("--out", metavar="PROFILE", help="write the fitted profile")
    parser.add_argument("--allow-busy", action="store_true")
    args = parser.parse_args()
    say = (lambda text: print(text, file=sys.stderr))
    try:
        outcome = validate(args.device, args.schedules.split(","), MeasureSettings(steps=args.steps),
                           allow_busy=args.allow_busy, wait_s=300.0, say=say)
    except (InputError, JobError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot_validation(outcome.checks, args.plot)
    if args.out:
        write_profile(outcome.profile, args.out)
    report = format_validation(outcome)
    fit = outcome.fit
    median, worst, count = step_errors(outcome.checks)
    lines = report.splitlines()
    goal = (f"goal: median <= {GOAL_MEDIAN_PCT:.0f} %, max <= {GOAL_MAX_PCT:.0f} %: "
            f"{'met' if count and median <= GOAL_MEDIAN_PCT and worst <= GOAL_MAX_PCT else 'NOT met'}; "
            f"fitted efficiency multiplier {fit.efficiency_multiplier:.3f}, action overhead "
            f"{fit.action_overhead_s * 1e3:.2f} ms ({'in range' if not outcome.fit_problems else 'OUT OF RANGE'})")
    print("\n".join([*lines[:-1], goal, lines[-1]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
