"""The measurement job's noise gauges: the speed canary is judged against its fastest time.

A machine can start a job slow (a neighbour busy at first) and run faster later. The
canary's reference is therefore the fastest it has run on any rank, lowered whenever
it runs faster, and at the end of the job every kept number's slowdown is restated
against the fastest of the whole job. Here the canary's times are scripted, on a
one-rank gloo group in this process.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from mpsim.calibrate.measure import guard as guard_module  # noqa: E402  (imports torch)
from mpsim.calibrate.measure.guard import LoadGuard, rebase_slowdowns  # noqa: E402


@pytest.fixture
def one_rank(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def scripted_canary(monkeypatch, times: list[float]) -> None:
    """The canary's samples, in seconds, in the order they are taken; no foreign CPU share.

    The share is read from this machine's /proc/stat, where the suite's other workers show
    as other processes: these tests are of the canary, so the machine is not read."""
    it = iter(times)
    monkeypatch.setattr(guard_module.SpeedCanary, "sample", lambda self, *args, **kwargs: next(it))
    monkeypatch.setattr(guard_module, "cpu_sample", lambda: None)


def test_a_machine_that_starts_slow_flags_what_it_measured_at_that_speed(one_rank, monkeypatch):
    # seven samples when the guard is built (all slow), then before and after each measurement
    scripted_canary(monkeypatch, [2.0] * 7 + [2.0, 2.0] + [1.0, 1.0] + [2.0, 2.0])
    guard = LoadGuard(torch.device("cpu"), "cpu", limit=0.15, wait_budget_s=0.0)
    guard.start()
    first = guard.check()  # measured at the starting speed: quiet so far, nothing faster seen yet
    assert first.slowdown == pytest.approx(1.0) and not guard.disturbed(first)
    guard.start()
    fast = guard.check()  # the machine shows its real speed
    assert fast.slowdown == pytest.approx(1.0) and guard.canary.fastest_s == pytest.approx(1.0)
    guard.start()
    again = guard.check()  # back at the starting speed: now that is twice as slow as the machine can run
    assert again.slowdown == pytest.approx(2.0) and guard.disturbed(again)
    # at the end of the job the first measurement is judged by the fastest time too
    record = {"links": {**first.as_dict(), "points": [1, 2]},
              "pipeline": {"1f1b": {"steps": [{"start_s": 0.0, **first.as_dict()}, {"start_s": 1.0, **fast.as_dict()}]}}}
    rebase_slowdowns(record, guard.canary.fastest_s)
    assert record["links"]["slowdown"] == pytest.approx(2.0)
    assert [s["slowdown"] for s in record["pipeline"]["1f1b"]["steps"]] == pytest.approx([2.0, 1.0])
    assert record["links"]["points"] == [1, 2]


def test_a_canary_that_never_runs_faster_keeps_its_first_reference(one_rank, monkeypatch):
    scripted_canary(monkeypatch, [1.0, 1.1, 1.2, 1.0, 1.05, 1.3, 1.1] + [1.1, 1.5])
    guard = LoadGuard(torch.device("cpu"), "cpu", limit=0.15, wait_budget_s=0.0)
    assert guard.canary.fastest_s == pytest.approx(1.0)  # the fastest of the samples, not their median
    guard.start()
    measured = guard.check()
    assert measured.slowdown == pytest.approx(1.5) and measured.canary_s == pytest.approx(1.5)
    assert guard.disturbed(measured)  # over the 1.25 limit: measured again


def test_op_passes_are_spread_evenly_over_the_rounds():
    from mpsim.calibrate.measure.phases import MIN_OP_PASSES, op_pass_count, op_pass_due

    for steps in range(0, 12):
        slots = max(MIN_OP_PASSES, steps)
        passes = op_pass_count(steps)
        due = [index for index in range(slots) if op_pass_due(index, passes, slots)]
        assert len(due) == passes >= MIN_OP_PASSES and due[0] == 0
        assert passes == max(MIN_OP_PASSES, -(-steps // 2))  # one every other round
        gaps = {b - a for a, b in zip(due, due[1:])}
        assert gaps <= {1, 2}, (steps, due)  # never two rounds in a row without a pass
