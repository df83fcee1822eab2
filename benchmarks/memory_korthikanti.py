"""Memory per GPU against Korthikanti et al. 2022, Figure 1 (first pipeline stage, A100 80GB).

For the 22B, 175B, 530B and 1T configurations of Table 3 (SP + selective recompute and
full recompute setups of ``validate_korthikanti.py``), mpsim's memory model is compared
with the figure's three bars per model: parameters + optimizer state, activations
without recompute, activations with sequence parallelism + selective recompute. The
figure counts the transformer layers only: their state (weights, fp32 gradients, Adam:
18 bytes per parameter) and their in-flight activations on the first stage; mpsim
reports the same of the same rank (its full report adds the embedding and LM head). The last line is ``max_rel_error_pct=<x> mean_rel_error_pct=<y>``.

Usage: python benchmarks/memory_korthikanti.py
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from mpsim.results.memory import rank_memory
from mpsim.simulate import simulate
from mpsim.specs import load_scenario

HERE = Path(__file__).resolve().parent
GiB = 2.0**30
# Korthikanti et al. 2022, Figure 1 (GiB per GPU)
FIGURE_1 = {
    "22B": (45.56, 59.25, 9.56),
    "175B (GPT-3)": (45.56, 66.84, 12.35),
    "530B (MT-NLG)": (31.64, 114.02, 23.08),
    "1T": (32.96, 131.25, 26.56),
}


def _row_overrides():
    spec = importlib.util.spec_from_file_location("validate", HERE / "validate_korthikanti.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.row_overrides


def first_stage_memory(overrides: list[str]):
    """Memory of pipeline rank 0 for a scenario built from --set overrides."""
    scenario = load_scenario(HERE.parent / "scenarios" / "megatron_22b_8xa100.yaml", overrides).scenario
    result = simulate(scenario)
    return rank_memory(scenario, result.layout, result.schedule, result.workload)[0]


def compare() -> list[tuple[str, str, float, float]]:
    """(model, quantity, figure GiB, mpsim GiB) for the 12 bars of Figure 1."""
    row_overrides = _row_overrides()
    rows = []
    for row in csv.DictReader((HERE / "data" / "korthikanti2022_tables3_5.csv").open()):
        base = row_overrides(row)
        state, none, selective = FIGURE_1[row["model"]]
        plain = first_stage_memory(base + ["parallel.recompute=none", "parallel.sequence_parallel=false"])
        sp_sel = first_stage_memory(base + ["parallel.recompute=selective", "parallel.sequence_parallel=true"])
        rows += [(row["model"], "parameters + optimizer state", state, plain.layer_state_bytes / GiB),
                 (row["model"], "activations, no recompute", none, plain.layer_activations_peak_bytes / GiB),
                 (row["model"], "activations, SP + selective", selective, sp_sel.layer_activations_peak_bytes / GiB)]
    return rows


def main() -> None:
    rows = compare()
    print(f"{'model':14s} {'quantity':30s} {'figure GiB':>10s} {'mpsim GiB':>10s} {'error':>8s}")
    errors = []
    for model, quantity, figure, ours in rows:
        error = 100 * (ours - figure) / figure
        errors.append(abs(error))
        print(f"{model:14s} {quantity:30s} {figure:10.2f} {ours:10.2f} {error:+7.2f}%")
    print(f"max_rel_error_pct={max(errors):.2f} mean_rel_error_pct={sum(errors) / len(errors):.2f}")


if __name__ == "__main__":
    main()
