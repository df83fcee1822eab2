"""Fit the bandwidth-curve shape of each fabric to measured all-reduce bus bandwidths.

The hardware files give each fabric a peak (``efficiency`` x link rate) and the shape of
its measured curve, ``busbw(S) = peak / (1 + (n_half / S) ** k)`` (see
``mpsim/cost/links.py``). The peak comes from the plateau of the measurement (or a
library constant, as the system file says); this script finds the ``n_half`` and ``k``
that keep the largest relative error smallest over messages of 16 MiB and up, from the
microbenchmark data in ``benchmarks/data/nccl_busbw_measured.csv``. Nothing here looks
at training runs.

Those fits are in-sample: each shape is judged on the points it was fitted to. With
``--hold-out`` the script also gives each check an out-of-sample twin:

* by system: one curve shape (one ``n_half`` and ``k``; each fabric keeps its own peak)
  fitted to the fabrics of some systems (``--train``, by default A100 and H200), and its
  error on the fabrics of the others (B200 NVLS and the B200 network), next to the error
  of their own fits;
* by size: each fabric fitted to every other size of its sweep from 16 MiB (16, 64, 256
  MiB, ...) and checked on the sizes between (32, 128, 512 MiB, ...).

The shipped parameters are the per-fabric fits; they would change only if one shape
fitted on some systems predicted the others about as well as their own fits do.

Usage: python benchmarks/fit_busbw_curves.py [--hold-out] [--train A100,H200]
"""

from __future__ import annotations

import argparse
import csv
import re
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
    # the same rule (a 4-node sweep of the system's own GPUs over its NICs, the same peak)
    "400G per GPU InfiniBand (dgx-h100 scale_out)": (["4x 8 H100 (NDR InfiniBand)"], 8 * 50 * 0.97,
                                                     "8 NICs x 50 GB/s x 0.97 (SIMAI's CX-7 constant)"),
    "Infinity Fabric ring (mi300x-platform scale_up)": (["8x MI300X (AMD acceptance guide)"], None,
                                                        "plateau: the 8 GiB point"),
    # one GPU per node, so the sweep is the network alone; it levels off from 32 MiB (21.8, 22.5, 22.9 GB/s)
    "200G Slingshot per GPU (gh200-alps scale_out)": (["2x 1 GH200 (Slingshot 11)"], None,
                                                      "plateau: the 128 MiB point"),
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
    return fit_shared([(points, peak)])


def fit_shared(fabrics: list[tuple[list[tuple[float, float]], float]]) -> tuple[float, float, float]:
    """(worst error, n_half bytes, k): one shape for several fabrics, each ``(points, peak)``, on a grid."""
    best = (float("inf"), 0.0, 1.0)
    for n_half_mb in range(1, 401):
        for k_percent in range(50, 101):
            error = max(worst_error(points, peak, n_half_mb * 1e6, k_percent / 100) for points, peak in fabrics)
            if error < best[0]:
                best = (error, n_half_mb * 1e6, k_percent / 100)
    return best


def fabric_points(data: dict[str, list[tuple[float, float]]], fabric: str) -> tuple[list[tuple[float, float]], float]:
    """(points from 16 MiB, peak GB/s) of a fabric."""
    setups, peak, _ = FABRICS[fabric]
    points = [p for setup in setups for p in data[setup] if p[0] >= MIN_SIZE]
    if peak is None:
        peak = max(busbw for setup in setups for size, busbw in data[setup] if size == max(s for s, _ in data[setup]))
    return points, peak


def split_sizes(points: list[tuple[float, float]]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(every other size of the sweep from its smallest, the sizes between)."""
    sizes = sorted({size for size, _ in points})
    fitted = set(sizes[::2])
    return [p for p in points if p[0] in fitted], [p for p in points if p[0] not in fitted]


def training_fabrics(train: list[str]) -> list[str]:
    """The fabrics whose name contains one of the ``train`` words (system names or GPUs) as a whole
    word: H200 picks hgx-h200's fabric, not the GH200 network's."""
    chosen = [fabric for fabric in FABRICS
              if any(re.search(rf"(?<![a-z0-9]){re.escape(word.lower())}(?![a-z0-9])", fabric.lower()) for word in train)]
    if not chosen or len(chosen) == len(FABRICS):
        raise SystemExit(f"--train must pick some of the fabrics and leave others: {', '.join(FABRICS)}")
    return chosen


def hold_out_by_system(data, train: list[str]) -> tuple[float, float, float, float]:
    """Print the shared shape's errors; return (n_half, k, worst in-sample, worst out-of-sample error)."""
    fitted = training_fabrics(train)
    error, n_half, k = fit_shared([fabric_points(data, fabric) for fabric in fitted])
    print(f"hold-out by system: one shape fitted on {', '.join(fitted)} (each fabric keeps its own peak): "
          f"half_bandwidth_bytes {n_half / 1e6:.0f} MB, curve_exponent {k:.2f}")
    worst_out = 0.0
    for fabric in FABRICS:
        points, peak = fabric_points(data, fabric)
        shared = worst_error(points, peak, n_half, k)
        own = fit(points, peak)[0]
        kind = "in-sample    " if fabric in fitted else "out-of-sample"
        if fabric not in fitted:
            worst_out = max(worst_out, shared)
        print(f"  {kind} {fabric}: worst error {100 * shared:.1f} % over {len(points)} points >= 16 MiB "
              f"(its own fit: {100 * own:.1f} %)")
    print(f"  worst error in-sample {100 * error:.1f} %, out-of-sample {100 * worst_out:.1f} %")
    return n_half, k, error, worst_out


def hold_out_by_size(data) -> float:
    """Print each fabric's fit on every other size and its error on the sizes between; return the worst."""
    print("hold-out by size: each fabric fitted on every other size from 16 MiB, checked on the sizes between")
    worst_out = 0.0
    for fabric in FABRICS:
        points, peak = fabric_points(data, fabric)
        fitted, held = split_sizes(points)
        error, n_half, k = fit(fitted, peak)
        out = worst_error(held, peak, n_half, k)
        worst_out = max(worst_out, out)
        print(f"  {fabric}: half_bandwidth_bytes {n_half / 1e6:.0f} MB, curve_exponent {k:.2f}; in-sample "
              f"{100 * error:.1f} % over {len(fitted)} points, out-of-sample {100 * out:.1f} % over {len(held)} points")
    return worst_out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-out", action="store_true", help="also fit on some systems and sizes, check the others")
    parser.add_argument("--train", default="A100,H200",
                        help="comma-separated words picking the fabrics of the by-system fit (default A100,H200)")
    args = parser.parse_args(argv)
    data = load()
    for fabric in FABRICS:
        points, peak = fabric_points(data, fabric)
        error, n_half, k = fit(points, peak)
        print(f"{fabric}: peak {peak:.1f} GB/s ({FABRICS[fabric][2]}); half_bandwidth_bytes {n_half / 1e6:.0f} MB, "
              f"curve_exponent {k:.2f}; worst error {100 * error:.1f} % over {len(points)} points >= 16 MiB "
              f"(in-sample)")
    if args.hold_out:
        print()
        n_half, k, _, by_system = hold_out_by_system(data, [w.strip() for w in args.train.split(",") if w.strip()])
        print()
        by_size = hold_out_by_size(data)
        print()
        print(f"one shape for all systems ({n_half / 1e6:.0f} MB, {k:.2f}) misses the held-out systems by up to "
              f"{100 * by_system:.1f} %; the shipped shapes are the per-fabric fits")
        print(f"out_of_sample_max_error_pct_by_system={100 * by_system:.1f}")
        print(f"out_of_sample_max_error_pct_by_size={100 * by_size:.1f}")


if __name__ == "__main__":
    main()
