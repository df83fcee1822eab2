"""The link benchmark times a collective the way a step calls it: after a stretch of compute."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def one_rank(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_every_timed_collective_follows_a_stretch_of_compute(one_rank, monkeypatch):
    from mpsim.calibrate.measure import commbench

    events: list[str] = []
    monkeypatch.setattr(commbench, "_busy", lambda device, kind: events.append("busy"))
    real = commbench._collective
    monkeypatch.setattr(commbench, "_collective", lambda *args: (events.append("collective"), real(*args)))
    samples = commbench.collective_samples("all-reduce", 4096, 1, None, torch.device("cpu"), "cpu", repeats=3)
    assert len(samples) == 3 and all(s >= 0 for s in samples)
    assert events == ["busy", "collective"] * 5  # two warm-ups, then the timed three


def test_the_stretch_of_compute_outgrows_a_cores_l2_cache():
    from mpsim.calibrate.measure.commbench import BUSY_SIZE

    assert 3 * BUSY_SIZE * BUSY_SIZE * 4 > 1 << 20  # two operands and a product of fp32, over 1 MiB
