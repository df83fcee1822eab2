"""The Ray backend gives the local backend's results (a small sweep on a local Ray instance)."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import SCENARIOS

ray = pytest.importorskip("ray")

from mpsim.explore.sweep import run_sweep  # noqa: E402

SCENARIO = str(SCENARIOS / "llama3_70b_32xh100.yaml")
GRID = ["parallel.tp=8,3", "parallel.pp=2,4"]


def test_ray_backend_matches_the_local_one(tmp_path):
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    local = run_sweep(SCENARIO, GRID, workers=2, out=str(tmp_path / "local.jsonl"))
    remote = run_sweep(SCENARIO, GRID, backend="ray", workers=2, out=str(tmp_path / "ray.jsonl"))
    assert remote.report.backend == "ray" and remote.report.computed == 4
    assert [(r["key"], r["status"], r["error"], r["metrics"]) for r in remote.report.records] == \
        [(r["key"], r["status"], r["error"], r["metrics"]) for r in local.report.records]
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
    assert not ray.is_initialized()  # the run shut down the instance it started
    # and gave the process its signal handlers back (ray.init leaves a SIGTERM handler that exits)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
