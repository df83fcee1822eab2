"""The suite's workers share the machine (tests/conftest.py): a test marked ``alone`` runs with no other test."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from tests.conftest import LOCKS_FOLDER_ENV, _machine_lock_paths, _machine_share

HOLD_S = 0.5


def _hold(alone: bool, held, times) -> None:
    """In another process (another worker): take a share, say so, keep it HOLD_S, record when it was let go."""
    with _machine_share(alone=alone):
        held.set()
        time.sleep(HOLD_S)
        times.put(time.monotonic())


@pytest.fixture
def parallel_run(monkeypatch, tmp_path):
    # as in a worker of a parallel run; a folder of its own keeps these locks apart from the suite's
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw9")
    monkeypatch.setenv(LOCKS_FOLDER_ENV, str(tmp_path))


def _taken_and_released(first_alone: bool, then_alone: bool) -> tuple[float, float]:
    """(when this process got its share, when another process that held one first let go)."""
    context = multiprocessing.get_context("fork")
    held, times = context.Event(), context.Queue()
    other = context.Process(target=_hold, args=(first_alone, held, times))
    other.start()
    assert held.wait(timeout=30)
    with _machine_share(alone=then_alone):
        taken = time.monotonic()
    released = times.get(timeout=30)
    other.join(timeout=30)
    return taken, released


@pytest.mark.parametrize("first_alone,then_alone", [(False, True), (True, False), (True, True)])
def test_a_share_waits_while_the_machine_is_held_alone(parallel_run, first_alone, then_alone):
    taken, released = _taken_and_released(first_alone, then_alone)
    assert taken >= released  # no overlap: the second waited for the first to let go


def test_shared_holders_run_together(parallel_run):
    taken, released = _taken_and_released(False, False)
    assert taken < released  # two ordinary tests on two workers do not wait for each other


def test_a_serial_run_takes_no_lock(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert _machine_lock_paths() is None
