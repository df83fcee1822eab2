"""benchmarks/gemm_sweep.py prices every published GEMM measurement it holds (an out-of-sample kernel check)."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import ROOT


def test_every_measured_shape_is_priced(capsys):
    spec = importlib.util.spec_from_file_location("gemm_sweep", ROOT / "benchmarks" / "gemm_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    module.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("rows=28 mean_abs_error_pct=")
    # the in-sample rows are the accelerator files' MAMF figures and are counted apart
    assert any(line.startswith("Bekman, (in-sample: efficiency.gemm): rows=2 ") for line in lines)
