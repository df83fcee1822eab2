"""Predict the 8 iteration times of Korthikanti et al. 2022 (Table 5) and print the error.

Each row's configuration (Table 3) comes from the published data copied to
``benchmarks/data/korthikanti2022_tables3_5.csv``; the hardware and model come from the
shipped files. Nothing is tuned per row. The last line is
``mean_abs_error_pct=<x> max_abs_error_pct=<y>``.

Usage: python benchmarks/validate_korthikanti.py [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from mpsim.simulate import simulate
from mpsim.specs import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the rows are built as benchmarks/validate_published.py builds its Table 5 rows (Megatron-LM
# 2022's settings are listed in benchmarks/published_korthikanti.py), so the two print the same numbers
from published_korthikanti import KORTHIKANTI_MODES as MODES  # noqa: E402
from published_korthikanti import korthikanti_overrides as row_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "korthikanti2022_tables3_5.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args()
    base = ROOT / "scenarios" / "megatron_22b_8xa100.yaml"
    errors = []
    print(f"{'model':14s} {'mode':15s} {'measured_s':>10s} {'predicted_s':>11s} {'error':>8s}")
    for row in csv.DictReader(DATA.open()):
        for mode, column in (("full recompute", "iter_time_full_recompute_s"),
                             ("SP + selective", "iter_time_sp_plus_selective_s")):
            measured = float(row[column])
            scenario = load_scenario(base, row_overrides(row) + MODES[mode] + args.overrides).scenario
            predicted = simulate(scenario).timeline.step_time_s
            error = 100 * (predicted - measured) / measured
            errors.append(error)
            print(f"{row['model']:14s} {mode:15s} {measured:10.2f} {predicted:11.2f} {error:+7.1f}%")
    mean = sum(abs(e) for e in errors) / len(errors)
    print(f"mean_abs_error_pct={mean:.2f} max_abs_error_pct={max(abs(e) for e in errors):.2f}")


if __name__ == "__main__":
    main()
