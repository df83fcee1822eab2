"""mpsim's GEMM pricing against published GEMM throughput measurements, shape by shape.

``benchmarks/data/gemm_sweeps.csv`` holds measured TFLOP/s of single GEMMs (batch, M, N,
K with K the reduction), each row naming its source: XLA's measured H100 table (the data
behind its matmul cost interpolator: bf16, K from 256 to 4,096 at M, N of 2,048 and
4,096, timed from kernel traces), EleutherAI's A100 torch.mm sweeps (K = 4,096: three
shapes of its M sweep and two sweeps of the output width N, 64 to 448 at M = 27,648 and
1,536 to 6,144 at M = 2,304; timed with a synchronize after every call, so small shapes
carry launch time; the files print M x N x K with N the reduction), the same repository's
A100 torch.bmm sweeps (square GEMMs of 1,024 to 8,192 at batch 1 to 64, and M = N up to
8,192 at a reduction of 4,096; each shape's slowest of 200 synchronized calls, the calls
of at least 100 us kept; the files print b x M x K x N; calls of 9 ms and more ran where
the A100's clock had given way, which mpsim does not price, and are summed up apart as well:
docs/accuracy.md), and the MAMF rows of
the ml-engineering book, whose value is the accelerator file's ``efficiency.gemm``: those
rows are in-sample and marked so. Every published row is priced as a short benchmark (a cool
GPU at its top clock), without ``efficiency.sustained_compute``. This project's H200
readings (``benchmarks/hopper_kernels.py``: the dgxc layers' GEMMs after a minute of load,
and a few as ten-call bursts, in bf16 and, as Transformer Engine runs them, in fp8) are priced as they ran: bursts cool, loaded GEMMs at the
sustained rate; the loaded twins of the burst shapes set that rate (in bf16
``sustained_compute``, in fp8 ``sustained_compute_fp8``) and are in-sample. Each
shape is priced by ``mpsim/cost/compute.py`` as a
layer's GEMM is, on the accelerator file the GPU names; the script prints measured,
predicted and the error per row, a line per source, and last
``rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>`` over the out-of-sample rows
(negative: mpsim prices the GEMM slower than it ran).

Usage: python benchmarks/gemm_sweep.py
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from mpsim.cost.compute import ComputeModel
from mpsim.specs.accelerator import BYTES_PER_ELEMENT
from mpsim.specs.catalog import load_accelerator
from mpsim.workload.ops import Op

DATA = Path(__file__).resolve().parent / "data" / "gemm_sweeps.csv"
ACCELERATORS = {"H100 SXM": "h100-sxm-80gb", "A100 SXM": "a100-sxm-80gb", "A100": "a100-sxm-80gb",
                "H200 SXM": "h200-sxm-141gb", "GH200": "gh200", "B200 SXM": "b200", "GB200": "gb200",
                "MI300X": "mi300x", "MI325X": "mi325x"}
# this project's H200 readings (benchmarks/hopper_kernels.py): GEMMs as short bursts and under load
HOPPER = [DATA.parent / "hopper_kernels_h200.json", DATA.parent / "hopper_kernels_h200_burst.json",
          DATA.parent / "hopper_kernels_h200_fp8.json", DATA.parent / "hopper_kernels_h200_attention.json"]


# the batched sweep's calls this long or longer (16 of them) each ran 7-18 % below the best rate of
# its shape's shorter calls, on an A100 that had lowered its clock (4,096 cubed: 255.6 TFLOP/s in
# 4.3 ms calls, 209.6 in 21 ms calls; docs/accuracy.md). A descriptive split of the printout, not
# a parameter of the model
LONG_CALL_S = 9e-3


def predicted_tflops(model: ComputeModel, batch: int, m: int, n: int, k: int, dtype: str) -> float:
    element = BYTES_PER_ELEMENT[dtype]
    flops = 2.0 * batch * m * n * k
    op = Op(name="gemm", kind="gemm", flops=flops, bytes=element * batch * (m * k + k * n + m * n),
            shape=(batch, m, n, k), dtype=dtype)
    return flops / model.time(op) / 1e12


def burst_model(accelerator, dtype: str) -> ComputeModel:
    """The GEMM pricing of a short benchmark: the GPU cool, at its top clock (no sustained-load factor)."""
    efficiency = accelerator.efficiency.model_copy(update={"sustained_compute": 1.0, "sustained_compute_fp8": None})
    return ComputeModel(accelerator.model_copy(update={"efficiency": efficiency}), dtype)


def measured_rows() -> list[dict]:
    """The published rows (all short benchmarks) and this project's H200 readings, burst and loaded."""
    rows = [{**row, "load": "burst"} for row in csv.DictReader(DATA.open())]
    for path in HOPPER:
        record = json.loads(path.read_text())
        bursts = {gemm["label"] for gemm in record["gemm"] if gemm["phase"] == "burst"}
        for gemm in record["gemm"]:
            if gemm["phase"] not in ("burst", "loaded"):
                continue
            # the loaded twin of a bf16 burst set efficiency.sustained_compute (their ratio)
            twin = gemm["phase"] == "loaded" and gemm["label"] in bursts
            rows.append({"source": f"HOPPER-LOAD ({path.name}, {gemm['phase']})", "gpu": "H200 SXM", "dtype": "bf16",
                         "batch": 1, "m": gemm["m"], "n": gemm["n"], "k": gemm["k"], "tflops": gemm["tflops"],
                         "load": gemm["phase"], "sets_sustained": twin})
        fp8_bursts = {gemm["label"] for gemm in record.get("fp8", []) if gemm["phase"] == "fp8-burst"}
        for gemm in record.get("fp8", []):  # Transformer Engine's fp8 GEMMs
            if "tflops" in gemm:
                load = gemm["phase"].removeprefix("fp8-")
                # the loaded twin of an fp8 burst set efficiency.sustained_compute_fp8 (their ratio)
                twin = load == "loaded" and gemm["label"] in fp8_bursts
                rows.append({"source": f"HOPPER-LOAD ({path.name}, {gemm['phase']})", "gpu": "H200 SXM",
                             "dtype": "fp8", "batch": 1, "m": gemm["m"], "n": gemm["n"], "k": gemm["k"],
                             "tflops": gemm["tflops"], "load": load, "sets_sustained": twin})
    return rows


def main() -> None:
    models: dict[tuple[str, str, str], ComputeModel] = {}
    by_source: dict[str, list[float]] = {}
    out_of_sample: list[float] = []
    print(f"{'gpu':9s} {'dtype':5s} {'b':>2s} {'M':>6s} {'N':>6s} {'K':>6s} {'load':6s} {'measured':>9s} "
          f"{'predicted':>9s} {'error':>7s}  source")
    for row in measured_rows():
        gpu, dtype, load = row["gpu"], row["dtype"], row["load"]
        key = (gpu, dtype, load)
        if key not in models:
            accelerator = load_accelerator(ACCELERATORS[gpu])
            # a burst is priced as the GPU ran it, cool; a loaded GEMM at the sustained clock
            models[key] = burst_model(accelerator, dtype) if load == "burst" else ComputeModel(accelerator, dtype)
        batch, m, n, k = (int(row[c]) for c in ("batch", "m", "n", "k"))
        measured = float(row["tflops"])
        predicted = predicted_tflops(models[key], batch, m, n, k, dtype)
        error = 100 * (predicted - measured) / measured
        source = source_label(row["source"]) + (f" {dtype} {load}" if row["source"].startswith("HOPPER") else "")
        # in-sample: the MAMF rows set efficiency.gemm; the loaded/burst ratio of the H200 burst
        # shapes sets efficiency.sustained_compute and, in fp8, sustained_compute_fp8 (their loaded rows)
        in_sample = "MAMF" in row["source"] or row.get("sets_sustained", False)
        label = source + (" (in-sample)" if in_sample else "")
        by_source.setdefault(label, []).append(error)
        if label.endswith("torch.bmm"):
            # the batched sweep's long calls ran where the A100's clock had given way
            # (docs/accuracy.md): its rows again, by the length of one call
            call_s = 2.0 * batch * m * n * k / (measured * 1e12)
            long_call = f"{LONG_CALL_S * 1e3:g} ms"
            length = f"calls of {long_call} and more" if call_s >= LONG_CALL_S else f"calls under {long_call}"
            by_source.setdefault(f"{label}, {length}", []).append(error)
        if not in_sample:
            out_of_sample.append(error)
        print(f"{gpu:9s} {dtype:5s} {batch:2d} {m:6d} {n:6d} {k:6d} {load:6s} {measured:9.1f} {predicted:9.1f} "
              f"{error:+6.1f}%  {label}")
    print_error_summaries(by_source, out_of_sample)


def source_label(source: str) -> str:
    """A row's group: its source's first word, and for EleutherAI's sweeps the call they time
    (``torch.mm`` or ``torch.bmm``), whose timings differ (a mean of the calls, the slowest call)."""
    label = source.split(" ")[0]
    call = re.search(r"\((torch\.\w+)", source)
    return f"{label} {call.group(1)}" if label == "EleutherAI/cookbook" and call else label


def print_error_summaries(groups: dict[str, list[float]], overall: list[float]) -> None:
    """A line per group of percentage errors, then the last line over ``overall``."""
    print()
    for label, errors in groups.items():
        print(f"{label}: rows={len(errors)} mean_abs_error_pct={sum(map(abs, errors)) / len(errors):.2f} "
              f"mean_signed_error_pct={sum(errors) / len(errors):.2f}")
    print(f"rows={len(overall)} mean_abs_error_pct={sum(map(abs, overall)) / len(overall):.2f} "
          f"mean_signed_error_pct={sum(overall) / len(overall):.2f}")


if __name__ == "__main__":
    main()
