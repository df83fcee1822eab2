"""mpsim's pricing of memory-bound kernels against a published sweep of PyTorch's and Megatron's own.

``benchmarks/data/liger_kernels.csv`` holds the reference providers of the Liger-Kernel
benchmark (LIGER-BENCH in docs/hardware-sources.md): the kernels Liger's Triton kernels
are compared with, timed on an A100-SXM4-80GB and an H100 80GB HBM3 at several shapes
each. The families kept are those whose kernels a training step of mpsim prices, each
priced here by the same function the step calls:

* ``layer_norm`` / ``huggingface``: ``torch.nn.LayerNorm`` in fp32 over 4,096 rows,
  PyTorch's native kernel, priced as mpsim prices it (``norm_kernel: pytorch``: one pass
  each way, the scale's gradient a reduction of its own; ``norm_grad_ops`` with
  ``layers_impl: pytorch``);
* ``rms_norm`` / ``huggingface``: Hugging Face's ``LlamaRMSNorm`` run eagerly on bf16
  input over 2,048 rows, priced as mpsim's eager RMSNorm (``eager_rmsnorm_ops``) in the
  form the benchmark runs, its weight an fp32 parameter (38 bytes per element forward and
  118 backward, which ``tests/test_eager_norm.py`` holds to PyTorch's dispatch, where a
  bf16 weight moves 36 and 96);
* ``fused_add_rms_norm`` / ``huggingface``: the same eager RMSNorm after a residual add,
  both in fp32 over 2,048 rows, on the H100 (the benchmark's ``NaiveAddRMSNorm`` at its
  2026-04 version), priced at the eager RMSNorm's shares over the bytes its code moves
  (``ADD_RMSNORM_FP32``: 40 per element forward in 7 kernels, 128 backward in 17, which
  ``tests/test_memory_kernel_sweep.py`` holds to PyTorch's dispatch): the check of those
  shares, read on the A100, on another part;
* ``megatron_rms_norm`` / ``torch``: ``torch.nn.RMSNorm`` on bf16, 4,096 tokens; its
  times show a fused kernel (a composite of operators would move ten times the bytes),
  priced as PyTorch's native RMSNorm, as the LayerNorm above (the ``megatron`` provider,
  ``WrappedTorchNorm``, returns the same module and is left out);
* ``relu_squared`` / ``torch``: ``torch.square(relu(x))`` on bf16, 4,096 rows, priced as
  mpsim's squared ReLU in PyTorch operators (``PLAIN_FFN_ACTIVATIONS``);
* ``megatron_swiglu`` / ``torch``: ``silu(y1) * y2`` over ``torch.chunk`` of FC1's
  output, eagerly, 8,192 tokens, priced as ``PLAIN_FFN_ACTIVATIONS["swiglu"]``. The
  ``megatron`` provider (``bias_swiglu_impl``) is left out: Megatron-Core compiles it with
  ``torch.compile`` on PyTorch 2.2 and later, yet its backward took five times a one-pass
  kernel's time and 1.4 times PyTorch's own operators', so which kernels ran is not known;
* ``megatron_cross_entropy`` / ``megatron-unfused`` and ``megatron-fused``:
  Megatron-Core's ``vocab_parallel_cross_entropy`` and
  ``fused_vocab_parallel_cross_entropy`` at tensor parallelism 1 on bf16 logits, 8,192
  tokens, priced by ``cross_entropy_ops`` (``megatron``, ``megatron_fused``);
* ``cross_entropy`` / ``huggingface``: ``torch.nn.CrossEntropyLoss`` on fp32 logits of
  16,384 tokens (A100), priced as PyTorch's loss (``cross_entropy_ops``, ``pytorch``,
  nothing to cast). Its rows are a forward and a ``full`` pass, forward and backward with
  nothing resetting the logits' gradient between repetitions, so autograd adds each
  backward's gradient into the last one's (read both, write one fp32 value per logit),
  which the script prices beside the backward.

Forward rows time the forward alone. Backward rows of ``layer_norm``, ``rms_norm``,
``relu_squared`` and ``fused_add_rms_norm`` time the backward alone, from a retained
graph; those of the ``megatron_*`` families time a forward, a sum over
its output and the backward from it, and the script takes the backward as that row less
the forward row of the same shape. The sum's gradient is one value broadcast over the
output, so such a backward reads no output gradient from memory and the sum reads the
output once instead: the same bytes as mpsim's count for a one-kernel backward, one
element per output element fewer than its count for PyTorch's swiglu operators (which
read the gradient twice; the script prices those rows at the 12 elements a column they
moved), within 1 % for the cross entropy (its output is one loss per token). The families'
script versions, the dtypes and the shapes were read in the repository at the same commit.

Every price is a memory-bound op at the accelerator's streaming rate (``efficiency.memory``,
a BabelStream Triad or vector-add figure) plus its per-kernel overhead for each kernel;
none of these rows was in view when those were set. The one thing taken from the sweep
is the share of the streaming rate some families reach, each way: Megatron-Core's cross
entropy, eager and fused (``CROSS_ENTROPY_BANDWIDTH_SHARE`` and
``FUSED_CROSS_ENTROPY_BANDWIDTH_SHARE`` in ``mpsim/workload/embedding.py``), the eager
RMSNorm (``EAGER_RMSNORM_BANDWIDTH_SHARE`` in ``mpsim/workload/norms.py``), PyTorch's
native LayerNorm and RMSNorm (``NATIVE_NORM_BANDWIDTH_SHARE``, the same file; the best
part's reading where two ran), and SwiGLU over chunked halves and squared ReLU in
PyTorch's operators (``PLAIN_FFN_ACTIVATIONS`` in ``mpsim/workload/mlp.py``): read at the
largest vocabulary and the widest row, so those rows are in sample there and the smaller
shapes check only how the time scales; every other row is out of sample.

Prints measured and predicted microseconds and the error per row, the share of the
streaming rate each family reached at its largest shape (over the bytes mpsim counts for
it, less its per-kernel overheads), a line per GPU, family, provider and pass, and last ``rows=<n> mean_abs_error_pct=<x>
mean_signed_error_pct=<y>`` (negative: mpsim prices the kernel faster than it ran).

Usage: python benchmarks/memory_kernel_sweep.py
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_sweep import print_error_summaries  # noqa: E402

from mpsim.cost.compute import ComputeModel  # noqa: E402
from mpsim.specs.catalog import load_accelerator  # noqa: E402
from mpsim.workload.embedding import cross_entropy_ops  # noqa: E402
from mpsim.workload.mlp import FFN_ACTIVATIONS, PLAIN_FFN_ACTIVATIONS, activation_ops  # noqa: E402
from mpsim.workload.norms import (EAGER_RMSNORM_BANDWIDTH_SHARE, eager_rmsnorm_ops, fused_norm_op,  # noqa: E402
                                  norm_grad_ops)
from mpsim.workload.ops import Op, memory_op  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "liger_kernels.csv"
ACCELERATORS = {"A100": "a100-sxm-80gb", "H100": "h100-sxm-80gb"}
DTYPE_BYTES = {"torch.float32": 4, "torch.bfloat16": 2}
# the benchmark's NaiveAddRMSNorm on fp32 input (x + r, then the eager RMSNorm with an fp32 weight,
# returning both the normed sum and the sum; the casts to fp32 are no-ops): (bytes per element of
# the input, kernels) forward and backward, the backward from both outputs' gradients, the sum's
# gradient copied for the second input
ADD_RMSNORM_FP32 = ((40, 7), (128, 17))
# backward rows that time a forward and a backward together (module docstring)
BACKWARD_INCLUDES_FORWARD = ("megatron_rms_norm", "megatron_swiglu", "megatron_cross_entropy")


def shape(row: dict) -> tuple[int, int, int]:
    """(rows or tokens, width, bytes per element) of the row's input."""
    config = json.loads(row["config"])
    x = int(row["x_value"])
    kernel = row["kernel"]
    if kernel in ("layer_norm", "rms_norm", "relu_squared", "fused_add_rms_norm"):
        return config["M"], x, DTYPE_BYTES[config["dtype"]]
    if kernel == "cross_entropy":  # B x T rows of fp32 logits
        return config["B"] * config["T"], x, 4
    # the megatron_* benchmarks: [S, B, width] in bf16
    return config["S"] * config["B"], x, 2


def priced_ops(row: dict) -> list[Op]:
    """The ops a step of mpsim prices for this row's kernel and pass (a ``full`` row: both passes
    and the gradient's accumulation)."""
    backward = row["mode"] == "backward"
    tokens, width, element = shape(row)
    elements = tokens * width
    kernel, provider = row["kernel"], row["provider"]
    if kernel in ("layer_norm", "megatron_rms_norm"):  # PyTorch's native kernels
        kind = "layernorm" if kernel == "layer_norm" else "rmsnorm"
        if not backward:
            return [fused_norm_op("norm", elements, element, "pytorch", kind)]
        grad_input, grad_params = norm_grad_ops("norm", elements, element, "pytorch", "pytorch", kind)
        return grad_input + grad_params
    if kernel == "fused_add_rms_norm":
        moved, kernels = ADD_RMSNORM_FP32[backward]
        return [memory_op("add_norm", elements * moved, launches=kernels,
                          bandwidth_share=EAGER_RMSNORM_BANDWIDTH_SHARE[backward])]
    if kernel == "rms_norm":  # the benchmark's weight is an fp32 parameter
        forward, grad_input, grad_weight = eager_rmsnorm_ops("norm", elements, element, fp32_weight=True)
        return [grad_input, grad_weight] if backward else [forward]
    if kernel in ("relu_squared", "megatron_swiglu"):
        name = "squared_relu" if kernel == "relu_squared" else "swiglu"
        activation = FFN_ACTIVATIONS[name] if provider == "megatron" else PLAIN_FFN_ACTIVATIONS[name]
        if kernel == "megatron_swiglu" and provider == "torch":
            # the benchmark's backward from a sum reads no output gradient: one element a column
            # fewer than the operators' backward in a step, which reads it twice (module docstring)
            activation = replace(activation, backward_traffic=activation.backward_traffic - 1)
        return [activation_ops("act", elements, element, activation)[backward]]
    if kernel == "megatron_cross_entropy":
        implementation = "megatron_fused" if provider == "megatron-fused" else "megatron"
        return [cross_entropy_ops("ce", elements, element, implementation)[backward]]
    if kernel == "cross_entropy":
        forward, grad = cross_entropy_ops("ce", elements, element, "pytorch")
        if row["mode"] == "full":
            return [forward, grad, memory_op("accumulate_grad", elements * 3 * element)]
        return [grad] if backward else [forward]
    raise ValueError(f"{DATA.name}: no pricing for kernel {kernel!r}")


def rows() -> list[dict]:
    return list(csv.DictReader(DATA.open()))


def models() -> dict[str, ComputeModel]:
    """The compute model of each GPU the rows name."""
    return {gpu: ComputeModel(load_accelerator(name), "bf16") for gpu, name in ACCELERATORS.items()}


def label(row: dict) -> str:
    """The group a row is summarised in: GPU, family, provider and pass."""
    return f"{row['gpu']} {row['kernel']} {row['provider']} {row['mode']}"


def measured_s(row: dict, table: list[dict]) -> float:
    """The row's time; a backward that includes its forward less that forward."""
    seconds = float(row["median_ms"]) * 1e-3
    if row["mode"] == "backward" and row["kernel"] in BACKWARD_INCLUDES_FORWARD:
        forward = next(r for r in table if r["mode"] == "forward" and all(
            r[k] == row[k] for k in ("gpu", "kernel", "provider", "x_value", "config")))
        seconds -= float(forward["median_ms"]) * 1e-3
    return seconds


def streaming_share(model: ComputeModel, row: dict, table: list[dict]) -> float:
    """The share of the streaming rate the row's kernels reached over the bytes mpsim counts for
    them: those bytes at ``efficiency.memory`` over the measured time less the per-kernel overheads."""
    ops = priced_ops(row)
    streaming_s = sum(op.bytes / model.memory_bandwidth for op in ops)
    fixed_s = sum(model.overhead_s * op.launches for op in ops)
    return streaming_s / (measured_s(row, table) - fixed_s)


def largest_shape_shares(table: list[dict] | None = None) -> dict[str, float]:
    """:func:`streaming_share` at each GPU, family, provider and pass's largest shape."""
    table = rows() if table is None else table
    by_gpu = models()
    largest: dict[str, tuple[int, float]] = {}
    for row in table:
        tokens, width, _ = shape(row)
        if tokens * width >= largest.get(label(row), (0, 0.0))[0]:
            largest[label(row)] = (tokens * width, streaming_share(by_gpu[row["gpu"]], row, table))
    return {group: share for group, (_, share) in largest.items()}


def main() -> None:
    table = rows()
    by_gpu = models()
    groups: dict[str, list[float]] = {}
    errors: list[float] = []
    print(f"{'gpu':5s} {'kernel':23s} {'provider':17s} {'pass':8s} {'shape':>13s} {'measured':>10s} "
          f"{'predicted':>10s} {'error':>7s}")
    for row in table:
        model = by_gpu[row["gpu"]]
        measured = measured_s(row, table)
        predicted = sum(model.time(op) for op in priced_ops(row))
        error = 100 * (predicted - measured) / measured
        groups.setdefault(label(row), []).append(error)
        errors.append(error)
        tokens, width, _ = shape(row)
        print(f"{row['gpu']:5s} {row['kernel']:23s} {row['provider']:17s} {row['mode']:8s} "
              f"{f'{tokens}x{width}':>13s} {measured * 1e6:9.1f}u {predicted * 1e6:9.1f}u {error:+6.1f}%")
    print("\nshare of the streaming rate (efficiency.memory) each family reached at its largest shape, over "
          "the bytes mpsim counts for it and less its per-kernel overheads:")
    for group, share in largest_shape_shares(table).items():
        print(f"  {group}: {share:.3f}")
    print_error_summaries(groups, errors)


if __name__ == "__main__":
    main()
