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

Each row says whether it is in-sample (``in``: a curve was fitted to it by
``benchmarks/fit_busbw_curves.py``, or a peak or efficiency of a system file was read off
it) or out-of-sample (``out``), and the error is summarized for both. With ``--hold-out``
every curve of every system takes one shape fitted on some systems only (``--train``,
by default the A100 and H200 fabrics), and the rows of the other systems are the
out-of-sample twin of the check.

Last line: ``max_rel_error_pct_ge_16MB=<x>`` over every measured point of 16 MB and up.

Usage: python benchmarks/nccl_busbw.py [--hold-out] [--train A100,H200]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from mpsim.cost.collectives import algorithm_estimates, choose_algorithm, collective_time
from mpsim.cost.topology import place_ranks
from mpsim.specs.catalog import load_system

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_busbw_curves  # noqa: E402  (the fits whose points are in-sample here)

DATA = Path(__file__).resolve().parent / "data" / "nccl_busbw_measured.csv"
MIN_SIZE = 16e6  # "16 MB and up": every point from 16 MiB
FITTED_SETUPS = {setup for setups, _, _ in fit_busbw_curves.FABRICS.values() for setup in setups}
# points a system file reads a peak or efficiency from (its comment says so): (setup, op, size in
# bytes, or None for a setup of one point); the other sizes of such a sweep check the curve's shape
PEAK_POINTS = {("8x H200 ring", "all-reduce", None), ("8x B200 ring", "all-reduce", None),
               ("72x GB200 NVL72 (CoreWeave)", "all-reduce", 8 * 2**30)}
# the systems whose fabrics each fit of fit_busbw_curves.FABRICS stands for
FABRIC_SYSTEMS = {"NVLink 3 ring": "dgx-a100", "NVLink 4 NVLS": "hgx-h200", "NVLink 5 NVLS": "hgx-b200",
                  "400G per GPU network": "hgx-b200", "Infinity Fabric ring": "mi300x-platform"}


# the multi-node sweeps below 1 MiB, by the tool column: nccl-tests on H100 (NCCL-T309), and the
# Alps runs of De Sensi et al. (BLINK-ALPS: 8 B to 32 KiB on 2 to 512 nodes, median times)
LATENCY_SWEEPS = {"nccl-tests": "nccl-tests", "blink": "Blink on Alps, medians"}


def in_sample(row: dict[str, str]) -> bool:
    """Whether a measured point set a curve (from 16 MiB) or a peak of the file that predicts it."""
    if float(row["size_bytes"]) < fit_busbw_curves.MIN_SIZE:
        return False
    size = int(row["size_bytes"])
    return row["setup"] in FITTED_SETUPS or any(
        (row["setup"], row["op"]) == (setup, op) and at in (None, size) for setup, op, at in PEAK_POINTS)


def with_shape(system, n_half: float, k: float):
    """The system with every bandwidth curve (scale-up, in-switch, network) given one shape."""
    curve = {"half_bandwidth_bytes": n_half, "curve_exponent": k}
    up = system.scale_up
    nvls = up.in_switch_reduction.model_copy(update=curve) if up.in_switch_reduction is not None else None
    return system.model_copy(update={"scale_up": up.model_copy(update={**curve, "in_switch_reduction": nvls}),
                                     "scale_out": system.scale_out.model_copy(update=curve)})


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
    if size < 2**10:
        return f"{size:g} B"
    if size % 1e6 == 0:
        return f"{size / 1e9:g} GB"
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size / factor:.0f} {unit}"
    return f"{size / 1e9:g} GB"


def measured_against_predicted(systems: dict | None = None, trained: set[str] | None = None) -> tuple[float, float]:
    """Print every measured point with its prediction; return the worst error at >= 16 MB (%), all and out-of-sample.

    ``systems``: the system specs to predict with (the shipped files when absent). ``trained``:
    the systems a shared curve shape was fitted on (hold-out): their rows are in-sample, the
    others' out-of-sample; without it each row is in-sample if it set a curve or a peak.
    """
    systems = {} if systems is None else systems
    worst_by_setup: dict[str, float] = {}
    worst = {True: 0.0, False: 0.0}
    count = {True: 0, False: 0}
    shape_factor = 1.0  # worst ratio either way between 1 MiB and 16 MiB
    # sweeps across nodes below 1 MiB, by tool: where latency sets the time (NCCL's LL protocol)
    latency_bound: dict[str, list[float]] = {}
    print(f"{'setup':28s} {'op':14s} {'size':>8s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'fit':>3s}  "
          f"algorithm")
    for row in csv.DictReader(DATA.open()):
        predicted, algorithm = predict(row, systems)
        measured = float(row["busbw_gbps"])
        error = 100 * (predicted - measured) / measured
        size = float(row["size_bytes"])
        sample = in_sample(row) if trained is None else row["system"] in trained
        flag = "" if size >= MIN_SIZE else "  (below 16 MB: shape only)"
        print(f"{row['setup']:28s} {row['op']:14s} {size_label(size):>8s} {measured:9.2f} {predicted:9.2f} "
              f"{error:+6.1f}% {'in' if sample else 'out':>3s}  {algorithm}{flag}")
        if 2**20 <= size < MIN_SIZE:
            shape_factor = max(shape_factor, predicted / measured, measured / predicted)
        if size < 2**20 and int(row["nodes"]) > 1 and row["tool"] in LATENCY_SWEEPS:
            latency_bound.setdefault(row["tool"], []).append(error)
        if size >= MIN_SIZE:
            key = f"{row['setup']} {row['op']}"
            worst_by_setup[key] = max(worst_by_setup.get(key, 0.0), abs(error))
            worst[sample] = max(worst[sample], abs(error))
            count[sample] += 1
    print()
    for key, value in worst_by_setup.items():
        print(f"max |error| >= 16 MB  {key:42s} {value:5.1f} %")
    print(f"below 16 MB (1 MiB up) the prediction is within a factor {shape_factor:.2f} of the measurement")
    for tool, errors in latency_bound.items():
        print(f"below 1 MiB across nodes ({LATENCY_SWEEPS[tool]}): mean |error| "
              f"{sum(map(abs, errors)) / len(errors):.1f} %, from {min(errors):+.1f} to {max(errors):+.1f} % over "
              f"{len(errors)} points")
    what = "fitted on, or a peak read from" if trained is None else f"of {', '.join(sorted(trained))}"
    print(f"in-sample      max |error| >= 16 MB {worst[True]:5.1f} % over {count[True]} points ({what})")
    print(f"out-of-sample  max |error| >= 16 MB {worst[False]:5.1f} % over {count[False]} points (the others)")
    return max(worst_by_setup.values()), worst[False]


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


def hold_out(train: list[str]) -> float:
    """Every curve given one shape fitted on the ``train`` fabrics; return the worst out-of-sample error (%)."""
    data = fit_busbw_curves.load()
    fitted = fit_busbw_curves.training_fabrics(train)
    _, n_half, k = fit_busbw_curves.fit_shared([fit_busbw_curves.fabric_points(data, f) for f in fitted])
    trained = {system for prefix, system in FABRIC_SYSTEMS.items() if any(f.startswith(prefix) for f in fitted)}
    others = {system for system in FABRIC_SYSTEMS.values() if system not in trained}
    if trained & others:
        raise SystemExit(f"--train splits the fabrics of one system ({', '.join(sorted(trained & others))})")
    print()
    print(f"hold-out: every curve shaped as fitted on {', '.join(fitted)} (half_bandwidth_bytes {n_half / 1e6:.0f} MB, "
          f"curve_exponent {k:.2f}); peaks and efficiencies as shipped")
    names = {row["system"] for row in csv.DictReader(DATA.open())}
    systems = {name: with_shape(load_system(name), n_half, k) for name in names}
    _, out = measured_against_predicted(systems, trained)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-out", action="store_true",
                        help="also predict with one curve shape fitted on some systems and check the others")
    parser.add_argument("--train", default="A100,H200", help="words picking the fabrics of the shared fit")
    args = parser.parse_args(argv)
    worst, out = measured_against_predicted()
    tpu_against_scaling_book()
    if args.hold_out:
        held = hold_out([word.strip() for word in args.train.split(",") if word.strip()])
        print(f"hold_out_max_rel_error_pct_ge_16MB_out_of_sample={held:.1f}")
    print(f"max_rel_error_pct_ge_16MB_out_of_sample={out:.1f}")
    print(f"max_rel_error_pct_ge_16MB={worst:.1f}")


if __name__ == "__main__":
    main()
