"""What steps that overlap across stages would gain: mpsim's schedules against Zero Bubble Table 10.

The Zero Bubble fork's optimizer post-validation (Qi et al. 2024, Section 5) drops the
global all-reduce before the optimizer step (gradient-norm clipping and the NaN / inf
check are validated afterwards, and rolled back if they fail), so each pipeline rank
starts its next step as soon as its own is done: the next step's warm-up runs under the
last one's cool-down. The paper's Table 10 measures ZB-2p both ways on its four setups:
8-11 % more samples per second with post-validation.

mpsim times one step on its own. This script asks what its own schedules say the
overlap is worth: it repeats each rank's action list of one step ``k`` times (the
microbatches of step ``j`` numbered on from step ``j - 1``'s, so every dependency is the
schedule's own) and runs them as one timeline, ``k = 2, 3, ...`` until two consecutive
steps end the same time apart (1e-9 relative): that period is the step time of a run
whose steps overlap. The gain is the isolated step's pipeline time over that period.
What ends a step on each rank is left out of both: the optimizer step (6-25 ms on these
stages, about 1 % of a step) and the all-reduce of the tied embedding's gradients
between the first and the last stage (DP is 1 in every setup, so there is no other
reduction). In the repeated run those would hold ranks 0 and ``p - 1`` at each step
boundary, so the gain printed is what the schedule allows, an upper bound on what the
fork can reach with them.

For each setup of Table 10 it prints the isolated step, the period, the gain mpsim's
schedule gives and the gain the paper measured, and 1F1B's on the same setup as a
control (a 1F1B rank 0 ends each step with the last backward, so nothing can overlap:
its gain is zero by construction); last::

    rows=<n> mean_abs_gain_error_pts=<x> predicted_mean_gain_pct=<y> measured_mean_gain_pct=<z>

Nothing is fitted; the schedules and costs are those of ``benchmarks/validate_published.py``.

Usage: python benchmarks/zero_bubble_post_validation.py [--max-steps K]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_common import DATA, number  # noqa: E402
from published_zero_bubble import ZB_BASE, more_rows, setups, zero_bubble_overrides  # noqa: E402

from mpsim.schedules.actions import Overlapped, Schedule  # noqa: E402
from mpsim.simulate import simulate  # noqa: E402
from mpsim.specs import load_scenario  # noqa: E402

SAME_PERIOD = 1e-9  # relative: two consecutive step periods this close are the steady state


def _shifted(item, by: int):
    """An action (or an overlapped pair's two) with the microbatch moved on by ``by``."""
    if isinstance(item, Overlapped):
        return Overlapped(_shifted(item.forward, by), _shifted(item.backward, by))
    return item._replace(microbatch=item.microbatch + by)


def repeated(schedule: Schedule, steps: int) -> Schedule:
    """``schedule``'s per-rank lists ``steps`` times over, step ``j``'s microbatches offset by ``j * m``."""
    m = schedule.num_microbatches
    ranks = tuple(tuple(_shifted(item, step * m) for step in range(steps) for item in items)
                  for items in schedule.actions)
    return Schedule(f"{schedule.name} x{steps}", m * steps, schedule.stage_to_rank, ranks, schedule.chains)


def overlapped_period(overrides: list[str], batch: int, max_steps: int) -> tuple[float, float, int]:
    """(the isolated step's pipeline time, the period of overlapping steps, steps run to find it).

    ``batch`` is one step's global batch. When ``max_steps`` steps end without two equal
    periods, the last period is returned with ``steps == max_steps``.
    """
    single = simulate(load_scenario(ZB_BASE, overrides).scenario)
    schedule = single.schedule  # the searched order for zb-1p / zb-2p, searched once
    ends = [single.timeline.pipeline_end_s]
    period = ends[0]
    for steps in range(2, max_steps + 1):
        scenario = load_scenario(ZB_BASE, [*overrides, f"parallel.global_batch_size={batch * steps}"]).scenario
        ends.append(simulate(scenario, schedule=repeated(schedule, steps)).timeline.pipeline_end_s)
        previous, period = period, ends[-1] - ends[-2]
        if steps > 2 and abs(period - previous) <= SAME_PERIOD * period:
            return ends[0], period, steps
    return ends[0], period, max_steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=8, help="most steps run to find the period (default 8)")
    args = parser.parse_args(argv)
    shapes = setups(DATA)
    rows = more_rows(DATA, "Table 10")
    measured = {(r["model"], r["schedule"].partition(" ")[2]): float(r["samples_per_s_per_gpu"]) for r in rows}
    print(f"{'setup':<22} {'schedule':<8} {'one step':>9} {'period':>9} {'steps':>5} {'gain':>7} {'measured':>9}")
    errors, predicted, observed = [], [], []
    for row in rows:
        if not row["schedule"].endswith("post-validation"):
            continue
        model, pp, microbatch, count = row["model"], number(row["num_gpus_pp"]), number(row["microbatch"]), \
            number(row["num_microbatches"])
        setup = f"{model} p={pp} b={microbatch} m={count}"
        gain_measured = 100.0 * (measured[(model, "post-validation")] / measured[(model, "all-reduce sync")] - 1.0)
        for schedule in ("ZB-2p", "1F1B"):
            start = time.perf_counter()
            overrides = zero_bubble_overrides(model, shapes[model], pp, 1, microbatch, count, schedule)
            alone, period, steps = overlapped_period(overrides, microbatch * count, args.max_steps)
            gain = round(100.0 * (alone / period - 1.0), 9) + 0.0  # no "-0.0" for 1F1B
            shown = f"{gain_measured:+8.1f}%" if schedule == "ZB-2p" else f"{'-':>9}"
            print(f"{setup:<22} {schedule:<8} {alone:8.3f}s {period:8.3f}s {steps:5d} {gain:+6.1f}% {shown}"
                  f"   ({time.perf_counter() - start:.1f} s)", flush=True)
            if schedule == "ZB-2p":
                errors.append(abs(gain - gain_measured))
                predicted.append(gain)
                observed.append(gain_measured)
    n = len(errors)
    print(f"rows={n} mean_abs_gain_error_pts={sum(errors) / n:.2f} predicted_mean_gain_pct={sum(predicted) / n:.2f} "
          f"measured_mean_gain_pct={sum(observed) / n:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
