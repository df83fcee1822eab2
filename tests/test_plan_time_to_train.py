"""``mpsim plan --tokens``: the best layouts' expected time to train with failures, checkpoints and restarts."""

from __future__ import annotations

import json

from mpsim.cli.main import main

PLAN = ["plan", "validation-8x512", "--cluster", "dgx-h100", "--devices", "2", "--global-batch", "4",
        "--workers", "1", "--top", "3", "--set", "reliability.storage_bandwidth=2 GB/s",
        "--set", "reliability.restart_time=10 min"]


def test_time_to_train_follows_each_layouts_step(capsys):
    assert main([*PLAN, "--tokens", "1e10", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    rows = body["time_to_train"]
    assert [row["step_rank"] for row in rows] == [1, 2, 3]
    for row, best in zip(rows, body["best"]):
        assert row["point"] == best["point"]
        assert row["step_time_s"] == best["metrics"]["step_time_s"]
        # without failures worth a restart the run is the steps plus checkpoint writes: never shorter
        assert row["days"] * 86400 >= 1e10 / (4 * 512) * row["step_time_s"] * (1 - 1e-12)
    assert [row["days"] for row in rows] == sorted(row["days"] for row in rows)


def test_ranking_by_time_to_train_needs_tokens(capsys):
    assert main([*PLAN, "--rank-by", "time-to-train"]) == 2
    assert "--tokens" in capsys.readouterr().err
    assert main([*PLAN, "--samples", "5"]) == 2
