"""benchmarks/gemm_sweep.py prices every published GEMM measurement it holds (an out-of-sample kernel check)."""

from __future__ import annotations

from tests.conftest import load_benchmark


def test_every_measured_shape_is_priced(capsys):
    module = load_benchmark("gemm_sweep")
    module.main()
    lines = capsys.readouterr().out.strip().splitlines()
    # 104 published rows and the project's H200 readings: bf16 3 x 37 loaded and 6 bursts, of
    # which the 6 loaded twins of the bursts set efficiency.sustained_compute and are in-sample;
    # fp8 7 bursts and their 7 loaded twins, which set efficiency.sustained_compute_fp8
    assert lines[-1].startswith("rows=222 mean_abs_error_pct=")
    # EleutherAI's A100 torch.mm sweeps: 3 shapes of the M sweep, 7 + 10 of the two output-width
    # sweeps, all at a reduction of 4,096 (the files print M x N x K with N the shared dimension)
    assert any(line.startswith("EleutherAI/cookbook torch.mm: rows=20 ") for line in lines)
    cookbook = [row for row in module.measured_rows() if row["source"].startswith("EleutherAI/cookbook")]
    mm = [row for row in cookbook if "(torch.mm " in row["source"]]
    assert len(mm) == 20 and {row["k"] for row in mm} == {"4096"}
    # and its torch.bmm sweeps, the calls of at least 100 us: 25 of the batch sweep (square GEMMs,
    # batch 1-64) and 34 of the M sweep (reduction 4,096); the files print b x M x K x N
    bmm = [row for row in cookbook if "(torch.bmm " in row["source"]]
    assert len(bmm) == 59 and len(cookbook) == 79
    assert any(line.startswith("EleutherAI/cookbook torch.bmm: rows=59 ") for line in lines)
    # printed again by the length of one call: the 16 calls of 9 ms and more, where the clock had
    # given way, are each priced faster than they ran
    long_calls = next(line for line in lines if line.startswith("EleutherAI/cookbook torch.bmm, calls of 9 ms"))
    assert "rows=16 " in long_calls
    abs_error, signed_error = (float(part.split("=")[1]) for part in long_calls.split()[-2:])
    assert abs_error == signed_error > 0
    assert any(line.startswith("EleutherAI/cookbook torch.bmm, calls under 9 ms: rows=43 ") for line in lines)
    seconds = [2 * int(r["batch"]) * int(r["m"]) * int(r["n"]) * int(r["k"]) / (float(r["tflops"]) * 1e12)
               for r in bmm]
    assert min(seconds) >= 100e-6
    assert {row["k"] for row in bmm if "bmm/msweep" in row["source"]} == {"4096"}
    assert all(row["m"] == row["n"] == row["k"] for row in bmm if "bmm/bsweep" in row["source"])
    # the in-sample rows are counted apart: the accelerator files' MAMF figures at their own shapes
    # (bf16: A100, H100, B200, GB200, MI300X, MI325X, GH200; fp8: H100, H200, B200, GB200) and those twins
    assert any(line.startswith("Bekman, (in-sample): rows=11 ") for line in lines)
    assert any(line.startswith("HOPPER-LOAD bf16 loaded (in-sample): rows=6 ") for line in lines)
    assert any(line.startswith("HOPPER-LOAD bf16 burst: rows=6 ") for line in lines)
    assert any(line.startswith("HOPPER-LOAD fp8 burst: rows=7 ") for line in lines)
    assert any(line.startswith("HOPPER-LOAD fp8 loaded (in-sample): rows=7 ") for line in lines)
