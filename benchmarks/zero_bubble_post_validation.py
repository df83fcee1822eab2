"""What steps that overlap across stages gain: mpsim's optimizer post-validation against Zero Bubble Table 10.

The Zero Bubble fork's optimizer post-validation (Qi et al. 2024, Section 5) drops the
global all-reduce before the optimizer step (gradient-norm clipping and the NaN / inf
check are validated afterwards, inside the next step's warm-up, and rolled back if they
fail), so each pipeline rank starts its next step once its own update is done: the next
step's warm-up runs under the last one's cool-down. The paper's Table 10 measures ZB-2p
both ways on its four setups: 8-11 % more samples per second with post-validation.

mpsim models it as a setting, ``training.optimizer_post_validation``
(``mpsim/engine/consecutive.py``): step after step run by the engine, each rank's next step
held until its own update, the updates chained down the pipeline and the check in the
warm-up held until the last rank's update, as the fork orders them; the step time is the
period of that run. This script prints, for each setup of Table 10, the step with the
synchronised optimizer, the period with post-validation, the gain and the gain the paper
measured, and 1F1B's gain on the same setup as a control (a 1F1B rank 0 ends each step
with the last backward, so nothing can overlap: its gain is zero by construction; the fork
allows post-validation with its zero-bubble schedules only). Last::

    rows=<n> mean_abs_gain_error_pts=<x> predicted_mean_gain_pct=<y> measured_mean_gain_pct=<z>

Nothing is fitted; the schedules and costs are those of ``benchmarks/validate_published.py``.

Usage: python benchmarks/zero_bubble_post_validation.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_common import DATA, number, simulate_step  # noqa: E402
from published_zero_bubble import ZB_BASE, more_rows, setups, zero_bubble_overrides  # noqa: E402


def gain(model: str, shape: dict[str, int], pp: int, microbatch: int, count: int, schedule: str
         ) -> tuple[float, float, float]:
    """(the synchronised step, the period with post-validation, the gain in percent) of ``schedule``."""
    steps = [simulate_step(ZB_BASE, zero_bubble_overrides(model, shape, pp, 1, microbatch, count, schedule,
                                                          post_validation)).step_time_s
             for post_validation in (False, True)]
    return steps[0], steps[1], round(100.0 * (steps[0] / steps[1] - 1.0), 9) + 0.0  # no "-0.0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    shapes = setups(DATA)
    rows = more_rows(DATA, "Table 10")
    measured = {(r["model"], r["schedule"].partition(" ")[2]): float(r["samples_per_s_per_gpu"]) for r in rows}
    print(f"{'setup':<22} {'schedule':<8} {'synced':>9} {'post-val':>9} {'gain':>7} {'measured':>9}")
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
            synced, period, gained = gain(model, shapes[model], pp, microbatch, count, schedule)
            shown = f"{gain_measured:+8.1f}%" if schedule == "ZB-2p" else f"{'-':>9}"
            print(f"{setup:<22} {schedule:<8} {synced:8.3f}s {period:8.3f}s {gained:+6.1f}% {shown}"
                  f"   ({time.perf_counter() - start:.1f} s)", flush=True)
            if schedule == "ZB-2p":
                errors.append(abs(gained - gain_measured))
                predicted.append(gained)
                observed.append(gain_measured)
    n = len(errors)
    print(f"rows={n} mean_abs_gain_error_pts={sum(errors) / n:.2f} predicted_mean_gain_pct={sum(predicted) / n:.2f} "
          f"measured_mean_gain_pct={sum(observed) / n:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
