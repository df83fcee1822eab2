"""Fit the bandwidth-curve shape of each fabric to measured all-reduce bus bandwidths.

The hardware files give each fabric a peak (``efficiency`` x link rate) and the shape of
its measured curve, ``busbw(S) = peak / (1 + (n_half / S) ** k)`` (see
``mpsim/cost/links.py``). The peak comes from the plateau of the measurement (or a
library constant, as the system file says); this script finds the ``n_half`` and ``k``
that keep the largest relative error smallest over messages of 16 MiB and up, from the
microbenchmark data in ``benchmarks/data/nccl_busbw_measured.csv``. Nothing here looks
at training runs.

Usage: python benchmarks/fit_busbw_curves.py
"""

from __future__ import annotations

import csv
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "nccl_busbw_measured.csv"
MIN_SIZE = 16 * 2**20

# fabric -> (setups whose points it is fitted to, peak bus bandwidth in GB/s and why)
FABRICS = {
    "NVLink 3 ring (dgx-a100 scale_up)": (["8x A100 (NVLink 3)"], 12 * 20.0,
                                          "NCCL's NVLink 3 constant: 12 links x 20 GB/s"),
    "NVLink 4 NVLS (hgx-h200 in_switch_reduction)": (["8x H200 NVLS", "8x H200 NVLS (nccl-tests)"], None,
                                                     "plateau: the 16 GiB point"),
    "NVLink 5 NVLS (hgx-b200 in_switch_reduction)": (["8x B200 (P6-B200)"], None, "plateau: the 16 GiB point"),
    "400G per GPU network (hgx-b200 scale_out)": (["4x 8 B200 (P6-B200)"], 8 * 50 * 0.97,
                                                  "8 NICs x 50 GB/s x 0.97 (SIMAI's CX-7 constant)"),
}


def load() -> dict[str, list[tuple[float, float]]]:
    """setup -> [(size_bytes, busbw GB/s)] of the all-reduce sweeps."""
    points: dict[str, list[tuple[float, float]]] = {}
    for row in csv.DictReader(DATA.open()):
        if row["op"] == "all-reduce":
            points.setdefault(row["setup"], []).append((float(row["size_bytes"]), float(row["busbw_gbps"])))
    return points


def worst_error(points: list[tuple[float, float]], peak: float, n_half: float, k: float) -> float:
    """Largest relative error of the curve over the points."""
    return max(abs(peak / (1 + (n_half / size) ** k) / busbw - 1) for size, busbw in points)


def fit(points: list[tuple[float, float]], peak: float) -> tuple[float, float, float]:
    """(worst error, n_half bytes, k) minimizing the worst error on a grid."""
    best = (float("inf"), 0.0, 1.0)
    for n_half_mb in range(1, 401):
        for k_percent in range(50, 101):
            error = worst_error(points, peak, n_half_mb * 1e6, k_percent / 100)
            if error < best[0]:
                best = (error, n_half_mb * 1e6, k_percent / 100)
    return best


def main() -> None:
    data = load()
    for fabric, (setups, peak, why) in FABRICS.items():
        points = [p for setup in setups for p in data[setup] if p[0] >= MIN_SIZE]
        if peak is None:
            peak = max(busbw for setup in setups for size, busbw in data[setup] if size == max(s for s, _ in data[setup]))
        error, n_half, k = fit(points, peak)
        print(f"{fabric}: peak {peak:.1f} GB/s ({why}); half_bandwidth_bytes {n_half / 1e6:.0f} MB, "
              f"curve_exponent {k:.2f}; worst error {100 * error:.1f} % over {len(points)} points >= 16 MiB")


if __name__ == "__main__":
    main()
