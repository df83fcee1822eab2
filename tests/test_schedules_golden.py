"""Every schedule PyTorch has: mpsim's per-rank order equals torch's own (golden files).

The files in tests/golden/schedules were written by tests/golden/make_schedule_goldens.py
from torch 2.13's generators; when torch 2.9 or newer is installed the last test
regenerates them in memory and checks the files still match (an older torch has no
``ScheduleDualPipeV``, and the test is skipped).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpsim.schedules import build_schedule, schedule_from_text

GOLDEN = Path(__file__).resolve().parent / "golden" / "schedules"
FILES = sorted(GOLDEN.glob("*.txt"))
NAME = re.compile(r"^(?P<name>[a-z0-9-]+)_p(?P<p>\d+)_v(?P<v>\d+)_m(?P<m>\d+)$")


def test_goldens_cover_every_torch_schedule():
    names = {NAME.match(path.stem)["name"] for path in FILES}
    assert names == {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"}
    assert len(FILES) > 200


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_order_matches_torch(path):
    match = NAME.match(path.stem)
    p, v, m = int(match["p"]), int(match["v"]), int(match["m"])
    ours = build_schedule(match["name"], p, v, m, check=True)
    assert ours.to_text() == path.read_text()
    assert schedule_from_text(path.read_text()).stage_to_rank == ours.stage_to_rank


def test_goldens_are_torchs_output(tmp_path, monkeypatch):
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not hasattr(torch_schedules, "ScheduleDualPipeV"):
        import torch

        pytest.skip(f"torch {torch.__version__} has no ScheduleDualPipeV (first in torch 2.9): "
                    "the goldens cannot be regenerated")
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_goldens", GOLDEN.parent / "make_schedule_goldens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    module.main()
    regenerated = {p.name: p.read_text() for p in tmp_path.glob("*.txt")}
    assert regenerated == {p.name: p.read_text() for p in FILES}
