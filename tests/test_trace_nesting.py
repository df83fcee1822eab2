"""Every shipped scenario's trace keeps Perfetto's rules for complete events (``ph: X``).

Perfetto's JSON importer puts the complete events of one (pid, tid) track on a stack:
an event must end no later than the event it starts inside, or it is a partial overlap
and the importer drops it. Times come from whole nanoseconds, each end rounded on its
own, so slices that touch or nest exactly still do after rounding.

The shipped scenarios are checked on the trace's rows, the whole nanoseconds the writer
turns into microseconds (a large step's full trace holds millions of slices, and turning
each into a dict costs more than building it); one scenario is checked as a JSON reader
gets its events back, and a test holds the two forms to the same slices.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from mpsim.results.trace import trace_events, trace_rows
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

SHIPPED = sorted(path.name for path in SCENARIOS.glob("*.yaml"))


def complete_slices(events: list) -> list[tuple[int, int, int, int, str]]:
    """(pid, tid, start ns, end ns, name) of every complete event: from event dicts (times in
    microseconds, as a JSON reader gets them) or from the trace's rows (whole nanoseconds)."""
    slices = []
    for event in events:
        if isinstance(event, dict):
            if event.get("ph") == "X":
                start = round(event["ts"] * 1000)  # whole nanoseconds, as written
                slices.append((event["pid"], event["tid"], start, start + round(event["dur"] * 1000), event["name"]))
        elif isinstance(event, tuple) and event[0] == "X":
            _, pid, tid, start, end, name = event[:6]
            slices.append((pid, tid, start, end, name))
    return slices


def nesting_violations(events: list) -> list[str]:
    """Partial overlaps on each track, as Perfetto's importer would find them."""
    tracks: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for pid, tid, start, end, name in complete_slices(events):
        tracks[(pid, tid)].append((start, end, name))
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
    assert nesting_violations(trace_rows(result)) == []


def test_the_rows_and_the_events_read_back_are_the_same_slices():
    result = simulate(load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml").scenario)
    events = trace_events(result)
    assert nesting_violations(events) == []
    slices = complete_slices(events)
    assert len(slices) > 10_000 and slices == complete_slices(trace_rows(result))
