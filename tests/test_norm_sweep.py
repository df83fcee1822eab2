"""benchmarks/norm_sweep.py prices a published sweep of fused norm kernels (an out-of-sample check)."""

from __future__ import annotations

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
