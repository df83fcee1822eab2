"""benchmarks/norm_sweep.py prices a published sweep of fused norm kernels (an out-of-sample check)."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark


def test_every_norm_pass_is_priced_and_the_times_are_the_benchmarks_own(capsys):
    module = load_benchmark("norm_sweep")
    module.main()
    lines = capsys.readouterr().out.strip().splitlines()
    # 15 shapes x 2 backends x 2 GPUs, each a forward and a backward
    assert lines[-1].startswith("rows=120 mean_abs_error_pct=")
    for gpu in ("H200", "GB200"):
        for backend in ("cudnn", "torch_compile"):
            for name in ("forward", "backward"):
                assert any(line.startswith(f"{gpu} {backend} {name}: rows=15 ") for line in lines)
    # a pass's time is the benchmark's byte count over its bandwidth: the llama3-8b RMSNorm forward on the
    # H200 through cuDNN, 16384 x 4096 in bf16 at 3708.1 GB/s, printed as 0.072 ms
    row = next(r for r in module.rows() if r["gpu"] == "H200" and r["model"] == "llama3-8b" and r["backend"] == "cudnn")
    assert abs(module.measured_s(row, backward=False) * 1e3 - 0.072) < 0.0005
    # a backward moves more than a forward and, with the scale's gradient a kernel of its own, is priced longer
    h200 = module.ComputeModel(module.load_accelerator("h200-sxm-141gb"), "bf16")
    compiled = dict(row, backend="torch_compile")
    assert module.predicted_s(h200, row, True) > module.predicted_s(h200, row, False)
    assert module.predicted_s(h200, compiled, True) > module.predicted_s(h200, row, True)


def test_fused_norm_share_is_the_best_published_reading_at_the_largest_shapes():
    """In sample: FUSED_NORM_BANDWIDTH_SHARE is read off this file, on the H200 (its streaming rate measured)."""
    from mpsim.workload.norms import FUSED_NORM_BANDWIDTH_SHARE

    module = load_benchmark("norm_sweep")
    streaming_gbps = module.ComputeModel(module.load_accelerator("h200-sxm-141gb"), "bf16").memory_bandwidth / 1e9
    rows = [r for r in module.rows() if r["gpu"] == "H200"]
    largest = max(int(r["tokens"]) * int(r["hidden"]) for r in rows)
    top = [r for r in rows if int(r["tokens"]) * int(r["hidden"]) == largest]
    assert len(top) == 6  # three shapes of 67.1 M elements, two backends
    best = tuple(max(float(r[column]) for r in top) / streaming_gbps for column in ("forward_gbps", "backward_gbps"))
    assert best == pytest.approx(FUSED_NORM_BANDWIDTH_SHARE, abs=5e-4)


def test_a_fused_norm_streams_slower_than_an_elementwise_kernel_of_its_bytes():
    from mpsim.cost.compute import ComputeModel
    from mpsim.specs.catalog import load_accelerator
    from mpsim.workload.norms import fused_norm_op, norm_grad_ops
    from mpsim.workload.ops import memory_op

    elements = 8192 * 8192
    for name in ("h200-sxm-141gb", "a100-sxm-80gb"):
        model = ComputeModel(load_accelerator(name), "bf16")
        assert model.time(fused_norm_op("norm", elements, 2)) > model.time(memory_op("copy", elements * 2 * 2))
        for impl in ("transformer_engine", "megatron", "pytorch"):
            grad_input, grad_params = norm_grad_ops("norm", elements, 2, impl)
            priced = sum(model.time(op) for op in grad_input + grad_params)
            streamed = sum(model.time(memory_op(op.name, op.bytes)) for op in grad_input + grad_params)
            assert priced > streamed, (name, impl)
        # PyTorch's native kernels measured slower than the best fused kernel, each way, each norm
        for kind in ("layernorm", "rmsnorm"):
            assert model.time(fused_norm_op("norm", elements, 2, "pytorch", kind)) > \
                model.time(fused_norm_op("norm", elements, 2, "fused", kind))
            native, fused = (sum(model.time(op) for op in sum(norm_grad_ops("norm", elements, 2, "pytorch", kernel,
                                                                                kind), []))
                             for kernel in ("pytorch", "fused"))
            assert native > fused, (name, kind)
