"""Every shipped scenario's trace keeps Perfetto's rules for complete events (``ph: X``).

Perfetto's JSON importer puts the complete events of one (pid, tid) track on a stack:
an event must end no later than the event it starts inside, or it is a partial overlap
and the importer drops it. Times come from whole nanoseconds, each end rounded on its
own, so slices that touch or nest exactly still do after rounding.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from mpsim.results.trace import trace_events
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

SHIPPED = sorted(path.name for path in SCENARIOS.glob("*.yaml"))


def nesting_violations(events: list[dict]) -> list[str]:
    """Partial overlaps on each track, as Perfetto's importer would find them."""
    tracks: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "X":
            start = round(event["ts"] * 1000)  # whole nanoseconds, as written
            tracks[(event["pid"], event["tid"])].append((start, start + round(event["dur"] * 1000), event["name"]))
    problems = []
    for track, slices in tracks.items():
        open_ends: list[tuple[int, str]] = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1][0] <= start:
                open_ends.pop()
            if open_ends and end > open_ends[-1][0]:
                problems.append(f"{track}: {name} [{start}, {end}] overruns {open_ends[-1][1]} ending {open_ends[-1][0]}")
            open_ends.append((end, name))
    return problems


def test_the_rule_finds_a_partial_overlap():
    events = [{"ph": "X", "pid": 0, "tid": 0, "ts": 0.0, "dur": 2.0, "name": "a"},
              {"ph": "X", "pid": 0, "tid": 0, "ts": 1.0, "dur": 1.001, "name": "b"}]
    assert len(nesting_violations(events)) == 1
    events[1]["dur"] = 1.0
    assert nesting_violations(events) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_trace_nests(name):
    result = simulate(load_scenario(SCENARIOS / name).scenario)
    assert nesting_violations(trace_events(result)) == []
