"""The validation report's split of a step-time error: inside actions, receive waits, the rest.

Built on mpsim's own prediction of the validation scenario (no torch needed): a measured
step made from the predicted timeline itself misses nothing, and one whose actions, waits
or gaps are made longer puts the difference exactly where it was added.
"""

from __future__ import annotations

import pytest

from mpsim.calibrate.check.compare import ScheduleCheck
from mpsim.calibrate.check.measured import MeasuredAction, MeasuredStep
from mpsim.calibrate.check.report import miss_lines
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

VALIDATION = SCENARIOS / "validation_2xcpu.yaml"


def _predicted(schedule: str, vpp: int):
    return simulate(load_scenario(VALIDATION, [f"parallel.schedule={schedule}", f"parallel.vpp={vpp}"]).scenario)


def _as_measured(result, longer_action_s: float = 0.0, longer_wait_s: float = 0.0, gap_s: float = 0.0,
                 rank_changed: int = 0) -> MeasuredStep:
    """The predicted timeline as a measured step; on ``rank_changed`` every action takes
    ``longer_action_s`` more, every wait for an input ``longer_wait_s`` more, and ``gap_s``
    passes before each action, everything after shifting along."""
    actions, waits = [], []
    for rank, records in enumerate(result.timeline.actions):
        changed = rank == rank_changed
        shift, ranked, blocked = 0.0, [], []
        for record in records:
            # after the previous action: the gap, then the wait for an input, then the action
            shift += gap_s if changed else 0.0
            if record.start_s > record.ready_s:
                extra = longer_wait_s if changed else 0.0
                blocked.append((record.ready_s + shift, record.start_s + shift + extra))
                shift += extra
            start = record.start_s + shift
            duration = record.end_s - record.start_s + (longer_action_s if changed else 0.0)
            item = record.action
            ranked.append(MeasuredAction(item.stage, item.kind, item.microbatch, start, start + duration))
            shift += longer_action_s if changed else 0.0
        actions.append(ranked)
        waits.append(blocked)
    return MeasuredStep(actions=actions, waits=waits)


@pytest.mark.parametrize("schedule,vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_the_prediction_as_measured_misses_nothing(schedule, vpp):
    result = _predicted(schedule, vpp)
    check = ScheduleCheck(schedule, vpp, True, [_as_measured(result)], 1, result)
    for miss in check.miss_by_rank():
        assert miss == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)


@pytest.mark.parametrize("what", ["actions", "waits", "gaps"])
def test_a_longer_part_shows_where_it_was_added(what):
    result = _predicted("1f1b", 1)
    records = result.timeline.actions[1]
    count = len(records)
    waiting = sum(r.start_s > r.ready_s for r in records)
    assert waiting > 0  # the second rank waits for its inputs in 1F1B
    extra = {"actions": dict(longer_action_s=0.002), "waits": dict(longer_wait_s=0.003),
             "gaps": dict(gap_s=0.001)}[what]
    step = _as_measured(result, rank_changed=1, **extra)
    check = ScheduleCheck("1f1b", 1, True, [step], 1, result)
    untouched, changed = check.miss_by_rank()
    assert untouched == pytest.approx((0.0, 0.0, 0.0), abs=1e-12)
    expected = {"actions": (0.002 * count, 0.0, 0.0), "waits": (0.0, 0.003 * waiting, 0.0),
                "gaps": (0.0, 0.0, 0.001 * count)}[what]
    assert changed == pytest.approx(expected, abs=1e-9)
    assert sum(changed) == pytest.approx(step.actions[1][-1].end_s - records[-1].end_s, abs=1e-9)

    class Outcome:
        checks = [check]

    line = miss_lines(Outcome())[1]
    assert f"rank 1 {changed.actions_s * 1e3:+.1f} / {changed.receive_waits_s * 1e3:+.1f} / " \
           f"{changed.rest_s * 1e3:+.1f} ms" in line
