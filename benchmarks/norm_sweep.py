"""mpsim's pricing of fused norms against a published norm-kernel sweep, pass by pass.

``benchmarks/data/cudnn_norms.csv`` holds NVIDIA's cuDNN Frontend norm benchmark
(``benchmark/norms``, release v1.19.0, cuDNN 9.19.1; CUDNN-NORMS in
docs/hardware-sources.md): RMSNorm and LayerNorm, forward and backward, bf16, at the
token x hidden shapes of eleven models, on one H200 and one GB200, each pass the median
of its timed iterations. Two of its three backends are kept, the fused kernels mpsim's
norm models describe (``mpsim/workload/norms.py``):

* ``cudnn``: one kernel each way, the scale's gradient reduced in the backward's own
  pass, as Transformer Engine's norms (``layers_impl: transformer_engine``);
* ``torch_compile``: Triton kernels generated from the PyTorch operators, the scale's
  gradient a reduction of its own, as mpsim prices a fused norm outside Transformer
  Engine (``layers_impl: pytorch``).

The third, ``pytorch``, is left out: which kernels it ran depends on the PyTorch version
(a composite of operators or one fused kernel), which the files do not print.

The files give bandwidth over the bytes each pass must move (the benchmark's
``compute_bandwidth_bytes``: forward, the input and the scale read, the output and the
fp32 statistics written; backward, the input, the output gradient and the statistics
read, the input's and the scale's gradients written), from which each pass's time is
recovered exactly; the printed milliseconds are rounded to a microsecond. mpsim prices
each pass as a step prices it: the ops ``mpsim/workload/norms.py`` lists for the
implementation, each a memory-bound kernel at the accelerator's measured streaming rate
(``efficiency.memory``) plus its per-kernel overhead. The efficiencies were not set with
these rows in view (the H200's is its BabelStream figure; the GB200's is inferred from
the B200's, the same die), so every row is out of sample.

Prints measured and predicted microseconds per pass and the error, a line per GPU,
backend and pass, and last ``rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>``
over all passes (negative: mpsim prices the norm faster than it ran).

Usage: python benchmarks/norm_sweep.py
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_sweep import print_error_summaries  # noqa: E402

from mpsim.cost.compute import ComputeModel  # noqa: E402
from mpsim.specs.catalog import load_accelerator  # noqa: E402
from mpsim.workload.norms import fused_norm_op, norm_grad_ops  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "cudnn_norms.csv"
ACCELERATORS = {"H200": "h200-sxm-141gb", "GB200": "gb200"}
# the benchmark's backends as mpsim's norm implementations (module docstring)
LAYERS_IMPL = {"cudnn": "transformer_engine", "torch_compile": "pytorch"}
DTYPE_BYTES = {"bfloat16": 2}


def moved_bytes(norm_type: str, tokens: int, hidden: int, has_bias: bool, element: int, backward: bool) -> float:
    """The bytes the benchmark counts for one pass (its ``compute_bandwidth_bytes``)."""
    n, c = tokens, hidden
    if not backward:
        if norm_type == "rms_norm":
            return (n * c + c) * element + n * c * element + n * 4
        return (n * c + c + (c if has_bias else 0)) * element + n * c * element + 8 * n
    if norm_type == "rms_norm":
        return (2 * n * c + c) * element + 4 * n + (n * c + c + (c if has_bias else 0)) * element
    return (2 * n * c + c) * element + 8 * n + (n * c + 2 * c) * element


def measured_s(row: dict, backward: bool) -> float:
    gbps = float(row["backward_gbps" if backward else "forward_gbps"])
    moved = moved_bytes(row["norm_type"], int(row["tokens"]), int(row["hidden"]), row["has_bias"] == "True",
                        DTYPE_BYTES[row["dtype"]], backward)
    return moved / (gbps * 1e9)


def predicted_s(model: ComputeModel, row: dict, backward: bool) -> float:
    """The pass as a step prices it: the norm's ops for the backend's implementation."""
    elements = int(row["tokens"]) * int(row["hidden"])
    element = DTYPE_BYTES[row["dtype"]]
    if not backward:
        ops = [fused_norm_op("norm", elements, element)]
    else:
        grad_input, grad_params = norm_grad_ops("norm", elements, element, LAYERS_IMPL[row["backend"]])
        ops = grad_input + grad_params
    return sum(model.time(op) for op in ops)


def rows() -> list[dict]:
    return list(csv.DictReader(DATA.open()))


def main() -> None:
    models: dict[str, ComputeModel] = {}
    groups: dict[str, list[float]] = {}
    errors: list[float] = []
    print(f"{'gpu':6s} {'backend':13s} {'norm':10s} {'tokens':>7s} {'hidden':>6s} {'pass':8s} {'measured':>9s} "
          f"{'predicted':>9s} {'error':>7s}  model")
    for row in rows():
        gpu = row["gpu"]
        if gpu not in models:
            models[gpu] = ComputeModel(load_accelerator(ACCELERATORS[gpu]), "bf16")
        for backward in (False, True):
            measured, predicted = measured_s(row, backward), predicted_s(models[gpu], row, backward)
            error = 100 * (predicted - measured) / measured
            name = "backward" if backward else "forward"
            groups.setdefault(f"{gpu} {row['backend']} {name}", []).append(error)
            errors.append(error)
            print(f"{gpu:6s} {row['backend']:13s} {row['norm_type']:10s} {int(row['tokens']):7d} {int(row['hidden']):6d} "
                  f"{name:8s} {measured * 1e6:8.1f}u {predicted * 1e6:8.1f}u {error:+6.1f}%  {row['model']}")
    print_error_summaries(groups, errors)


if __name__ == "__main__":
    main()
