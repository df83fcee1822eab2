"""mpsim's GEMM pricing against published GEMM throughput measurements, shape by shape.

``benchmarks/data/gemm_sweeps.csv`` holds measured TFLOP/s of single GEMMs (batch, M, N,
K with K the reduction), each row naming its source: XLA's measured H100 table (the data
behind its matmul cost interpolator: bf16, K from 256 to 4,096 at M, N of 2,048 and
4,096, timed from kernel traces), EleutherAI's A100 torch.mm sweep (K = 4,096, timed with
a synchronize after every call, so small shapes carry launch time), and the MAMF rows of
the ml-engineering book, whose value is the accelerator file's ``efficiency.gemm``: those
rows are in-sample and marked so. Each shape is priced by ``mpsim/cost/compute.py`` as a
layer's GEMM is, on the accelerator file the GPU names; the script prints measured,
predicted and the error per row, a line per source, and last
``rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>`` over the out-of-sample rows
(negative: mpsim prices the GEMM slower than it ran).

Usage: python benchmarks/gemm_sweep.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from mpsim.cost.compute import ComputeModel
from mpsim.specs.accelerator import BYTES_PER_ELEMENT
from mpsim.specs.catalog import load_accelerator
from mpsim.workload.ops import Op

DATA = Path(__file__).resolve().parent / "data" / "gemm_sweeps.csv"
ACCELERATORS = {"H100 SXM": "h100-sxm-80gb", "A100 SXM": "a100-sxm-80gb", "A100": "a100-sxm-80gb"}


def predicted_tflops(model: ComputeModel, batch: int, m: int, n: int, k: int, dtype: str) -> float:
    element = BYTES_PER_ELEMENT[dtype]
    flops = 2.0 * batch * m * n * k
    op = Op(name="gemm", kind="gemm", flops=flops, bytes=element * batch * (m * k + k * n + m * n),
            shape=(batch, m, n, k), dtype=dtype)
    return flops / model.time(op) / 1e12


def main() -> None:
    rows = list(csv.DictReader(DATA.open()))
    models: dict[tuple[str, str], ComputeModel] = {}
    by_source: dict[str, list[float]] = {}
    out_of_sample: list[float] = []
    print(f"{'gpu':9s} {'dtype':5s} {'b':>2s} {'M':>6s} {'N':>6s} {'K':>6s} {'measured':>9s} {'predicted':>9s} "
          f"{'error':>7s}  source")
    for row in rows:
        gpu, dtype = row["gpu"], row["dtype"]
        key = (gpu, dtype)
        if key not in models:
            models[key] = ComputeModel(load_accelerator(ACCELERATORS[gpu]), dtype)
        batch, m, n, k = (int(row[c]) for c in ("batch", "m", "n", "k"))
        measured = float(row["tflops"])
        predicted = predicted_tflops(models[key], batch, m, n, k, dtype)
        error = 100 * (predicted - measured) / measured
        source = row["source"].split(" ")[0]
        in_sample = "MAMF" in row["source"]
        label = source + (" (in-sample: efficiency.gemm)" if in_sample else "")
        by_source.setdefault(label, []).append(error)
        if not in_sample:
            out_of_sample.append(error)
        print(f"{gpu:9s} {dtype:5s} {batch:2d} {m:6d} {n:6d} {k:6d} {measured:9.1f} {predicted:9.1f} {error:+6.1f}%  "
              f"{label}")
    print()
    for label, errors in by_source.items():
        print(f"{label}: rows={len(errors)} mean_abs_error_pct={sum(map(abs, errors)) / len(errors):.2f} "
              f"mean_signed_error_pct={sum(errors) / len(errors):.2f}")
    print(f"rows={len(out_of_sample)} mean_abs_error_pct={sum(map(abs, out_of_sample)) / len(out_of_sample):.2f} "
          f"mean_signed_error_pct={sum(out_of_sample) / len(out_of_sample):.2f}")


if __name__ == "__main__":
    main()
