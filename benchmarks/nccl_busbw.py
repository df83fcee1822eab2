"""Predicted against measured collective bus bandwidth, and TPU collectives against the scaling book.

The measured points (``benchmarks/data/nccl_busbw_measured.csv``) are all-reduce sweeps
of nccl-tests or of a PyTorch benchmark that reports the same busbw (8x A100, 8x H200
with NVLS, 4 nodes of 8 B200, 8x B200), and single large-message points (8x H200 and
8x B200 ring with NVLS off, H200 all-gather and reduce-scatter, MI300X). Each row is
predicted with the shipped system file and the algorithm the model picks (rows marked
``ring`` force the ring, as ``NCCL_ALGO=Ring`` / NVLS off did when measured).

Then TPU v5p all-gather and all-reduce on 1, 2 and 3 axes of an 8x8x8 slice against the
scaling book's formulas: ``T_AG = V / (axes x W_bidir)``, ``T_AR = 2 T_AG``, with
``W_bidir`` = 2 x 9e10 B/s per axis; mpsim counts the exact ``(N-1)/N`` of the bytes a
chip still has to receive, which the formulas round to 1.

Last line: ``max_rel_error_pct_ge_16MB=<x>`` over every measured point of 16 MB and up.

Usage: python benchmarks/nccl_busbw.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from mpsim.cost.collectives import algorithm_estimates, choose_algorithm, collective_time
from mpsim.cost.topology import place_ranks
from mpsim.specs.catalog import load_system

DATA = Path(__file__).resolve().parent / "data" / "nccl_busbw_measured.csv"
MIN_SIZE = 16e6  # "16 MB and up": every point from 16 MiB


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw factor."""
    return 2 * (ranks - 1) / ranks if op == "all-reduce" else (ranks - 1) / ranks


def predict(row: dict[str, str], systems: dict) -> tuple[float, str]:
    """(predicted busbw GB/s, algorithm) of one measured row."""
    if row["system"] not in systems:
        systems[row["system"]] = load_system(row["system"])
    system = systems[row["system"]]
    ranks, nodes = int(row["ranks"]), int(row["nodes"])
    per_node = ranks // nodes
    members = [node * system.devices_per_node + i for node in range(nodes) for i in range(per_node)]
    place = place_ranks(members, system.devices_per_node)
    size = float(row["size_bytes"])
    if row["algorithm"] == "auto":
        estimate = choose_algorithm(row["op"], size, place, system)
    else:
        estimate = {e.algorithm: e for e in algorithm_estimates(row["op"], size, place, system)}[row["algorithm"]]
    return size / estimate.time_s * bus_factor(row["op"], ranks) / 1e9, estimate.algorithm


def size_label(size: float) -> str:
    if size % 1e6 == 0:
        return f"{size / 1e9:g} GB"
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size / factor:.0f} {unit}"
    return f"{size / 1e9:g} GB"


def measured_against_predicted() -> float:
    """Print every measured point with its prediction; return the worst error at >= 16 MB (%)."""
    systems: dict = {}
    worst_by_setup: dict[str, float] = {}
    shape_factor = 1.0  # worst ratio either way between 1 MiB and 16 MiB
    print(f"{'setup':28s} {'op':14s} {'size':>8s} {'measured':>9s} {'predicted':>9s} {'error':>7s}  algorithm")
    for row in csv.DictReader(DATA.open()):
        predicted, algorithm = predict(row, systems)
        measured = float(row["busbw_gbps"])
        error = 100 * (predicted - measured) / measured
        size = float(row["size_bytes"])
        flag = "" if size >= MIN_SIZE else "  (below 16 MB: shape only)"
        print(f"{row['setup']:28s} {row['op']:14s} {size_label(size):>8s} {measured:9.2f} {predicted:9.2f} "
              f"{error:+6.1f}%  {algorithm}{flag}")
        if 2**20 <= size < MIN_SIZE:
            shape_factor = max(shape_factor, predicted / measured, measured / predicted)
        if size >= MIN_SIZE:
            key = f"{row['setup']} {row['op']}"
            worst_by_setup[key] = max(worst_by_setup.get(key, 0.0), abs(error))
    print()
    for key, worst in worst_by_setup.items():
        print(f"max |error| >= 16 MB  {key:42s} {worst:5.1f} %")
    print(f"below 16 MB (1 MiB up) the prediction is within a factor {shape_factor:.2f} of the measurement")
    return max(worst_by_setup.values())


def tpu_against_scaling_book() -> float:
    """TPU v5p 8x8x8: mpsim against the scaling-book formulas; returns the worst gap beyond (N-1)/N (%)."""
    system = load_system("tpu-v5p-8x8x8")
    w_bidir = 2 * 9e10
    worst = 0.0
    print()
    print(f"{'TPU v5p group':22s} {'op':11s} {'V':>7s} {'scaling book':>13s} {'mpsim':>11s} {'ratio':>7s} "
          f"{'(N-1)/N':>8s}")
    groups = {"1 axis (8)": list(range(8)), "2 axes (8x8)": list(range(64)), "3 axes (8x8x8)": list(range(512))}
    for label, ranks in groups.items():
        axes = {"1": 1, "2": 2, "3": 3}[label[0]]
        place = place_ranks(ranks, system.devices_per_node)
        for op in ("all-gather", "all-reduce"):
            for size in (64 * 2**20, 2**30):
                formula_s = size / (axes * w_bidir) * (2 if op == "all-reduce" else 1)
                ours_s = collective_time(op, size, place, system)
                n = len(ranks)
                ratio = ours_s / formula_s
                worst = max(worst, abs(ratio / ((n - 1) / n) - 1) * 100)
                print(f"{label:22s} {op:11s} {size_label(size):>7s} {formula_s * 1e6:10.1f} us {ours_s * 1e6:8.1f} us "
                      f"{ratio:7.4f} {(n - 1) / n:8.4f}")
    print(f"tpu_v5p_max_gap_beyond_exact_factor_pct={worst:.2f}")
    return worst


def main() -> None:
    worst = measured_against_predicted()
    tpu_against_scaling_book()
    print(f"max_rel_error_pct_ge_16MB={worst:.1f}")


if __name__ == "__main__":
    main()
