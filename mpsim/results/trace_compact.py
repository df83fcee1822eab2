"""The compact trace of a large job: whole actions per pipeline rank, communication as counters.

The full trace draws every op of every action and one slice per collective per rank,
which for a 1T-parameter model over 64 stages and 512 microbatches is millions of
slices. The compact form keeps what a reader looks for at that scale, the pipeline's
shape and where its idle time goes, and turns communication into counters, one value
change per action or transfer instead of one slice per collective:

* one slice track per pipeline rank: each action whole (named ``0F3`` as in the
  schedule) and each idle gap with its cause, as in the full trace;
* one counter per rank, ``streams``, whose series (each a track in Perfetto) are
  ``collectives %`` and ``exposed collectives %`` (the share of the running action's
  time its TP / CP / EP collectives run, and run without compute to hide them; 0 while
  the rank is idle), ``activation sends`` and ``gradient sends`` (pipeline transfers
  this rank has in flight), ``gradient reductions`` (data-parallel buckets, and the
  embedding's between the first and last stage, in flight) and
  ``optimizer`` (1 while the optimizer step runs). An event names only the series that
  change at its time, so changes that coincide (an action ends, its send starts) are
  one event.

Times are whole microseconds, each end rounded on its own: rounding keeps the order of
any two times, so slices that touch or follow each other still do, and a step of
seconds needs no finer grain at this scale. Events are built as their JSON text
directly: a large job's compact trace still has hundreds of thousands of them, and
formatting each once is most of the time it takes to write.

A process stands for the whole TP, CP and DP group of its pipeline rank, as the engine
simulates it (``trace_writer.track_names``).
"""

from __future__ import annotations

import json
from collections import defaultdict

from mpsim.engine.core import duration_key
from mpsim.results.idle import KINDS as IDLE_KINDS
from mpsim.results.idle import idle_intervals
from mpsim.results.trace_writer import Row, track_names
from mpsim.schedules.actions import Action, Item, Overlapped
from mpsim.simulate import BubbleReference, SimulationResult

ACTIONS_TID = 0
STREAMS = "streams"
SERIES = ("collectives %", "exposed collectives %", "activation sends", "gradient sends",
          "gradient reductions", "optimizer")
_BUSY, _EXPOSED, _ACTIVATIONS, _GRADIENTS, _REDUCTIONS, _OPTIMIZER = range(len(SERIES))

# the fixed ends of the events' JSON text
_IDLE_JSON = {kind: f'"name":{json.dumps("idle: " + kind)},"cat":"idle"}}' for kind in IDLE_KINDS}
_SERIES_JSON = [json.dumps(series) + ":" for series in SERIES]
_KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)"}


def action_category(item: Item) -> str:
    """The slice category of a schedule item: what kind of pass it is."""
    return "forward+backward (overlapped)" if isinstance(item, Overlapped) else _KIND_NAMES[item.kind]


def _us(seconds: float) -> int:
    """Whole microseconds."""
    return round(seconds * 1e6)


def _percent(part_s: float, whole_s: float) -> float:
    return round(100.0 * part_s / whole_s, 1) if whole_s > 0 else 0.0


def _levels(series: int, intervals: list[tuple[int, int]], points: list[tuple[int, int, float]]) -> None:
    """Add to ``points`` (us, series, value) each change of how many of ``intervals`` are open;
    an interval of no length changes nothing."""
    changes = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    level = last = 0
    for index, (ts, delta) in enumerate(changes):
        level += delta
        if (index + 1 == len(changes) or changes[index + 1][0] != ts) and level != last:
            points.append((ts, series, level))
            last = level


def _action_rows(result: SimulationResult, rank: int, points: list[tuple[int, int, float]]) -> list[Row]:
    """Whole-action slices of ``rank`` as JSON text; adds the collectives' shares to ``points``
    unless all are 0. This loop runs once per action of the step (65,536 for Megatron 1T on
    512 GPUs), so a plain action is keyed and named inline, without method calls."""
    slices: list[Row] = []
    head = f'{{"ph":"X","pid":{rank},"tid":{ACTIONS_TID},"ts":'
    # per distinct pass (the engine's key: stage and kind, or an overlapped pair):
    # the slice's category as JSON text and the collectives' shares of its time
    passes: dict[tuple, tuple[str, float, float]] = {}
    steps: list[tuple[int, float, float]] = []  # (us, busy %, exposed %) from then on
    for record in result.timeline.actions[rank]:
        item = record.action
        # an action ends no earlier than it starts, and rounding keeps that
        start, end = round(record.start_s * 1e6), round(record.end_s * 1e6)
        plain = type(item) is Action
        key = (item[0], item[1]) if plain else duration_key(item)
        known = passes.get(key)
        if known is None:
            cost = result.cost(item)
            known = passes[key] = (f'"cat":{json.dumps(action_category(item))}}}',
                                   _percent(cost.tp_comm_s, cost.duration_s),
                                   _percent(cost.tp_exposed_s, cost.duration_s))
        category, busy, exposed = known
        # an action's name (0F3) is letters and digits, which JSON takes unescaped
        name = f'"{item[0]}{item[1]}{item[2]}"' if plain else json.dumps(str(item))
        slices.append(f'{head}{start},"dur":{end - start},"name":{name},{category}')
        while steps and steps[-1][0] == start:
            steps.pop()  # the previous action's end (or all of it, if it took no time): this one starts there
        steps.append((start, busy, exposed))
        steps.append((end, 0.0, 0.0))
    if any(busy or exposed for _, busy, exposed in steps):
        last = (0.0, 0.0)
        for index, (ts, busy, exposed) in enumerate(steps):
            if index + 1 < len(steps) and steps[index + 1][0] == ts:
                continue  # an action that took no time and nothing after it at once: its end counts
            if busy != last[0]:
                points.append((ts, _BUSY, busy))
            if exposed != last[1]:
                points.append((ts, _EXPOSED, exposed))
            last = (busy, exposed)
    return slices


def _streams(rank: int, points: list[tuple[int, int, float]]) -> list[Row]:
    """One counter event (JSON text) per time at which some series of ``rank`` changes,
    starting from 0.

    ``points`` come in an order the step fixes (the collectives' shares, then each count in
    turn), so grouping them by time keeps the series of each event in a fixed order."""
    if not points:
        return []
    start_values = dict.fromkeys(sorted({series for _, series, _ in points}), 0)
    pairs: dict[tuple[int, int | float], str] = {}  # (series, value) -> its JSON: values repeat
    by_ts: dict[int, str] = {}  # time -> the JSON of the series that change then
    for ts, series, value in points:
        if ts == 0:
            start_values[series] = value
            continue
        pair = pairs.get((series, value))
        if pair is None:
            pair = pairs[series, value] = _SERIES_JSON[series] + repr(value)
        text = by_ts.get(ts)
        by_ts[ts] = pair if text is None else text + "," + pair
    head = f'{{"ph":"C","pid":{rank},"name":"{STREAMS}","ts":'
    starting = ",".join(_SERIES_JSON[series] + repr(value) for series, value in start_values.items())
    return [f'{head}0,"args":{{{starting}}}}}'] + [f'{head}{ts},"args":{{{by_ts[ts]}}}}}' for ts in sorted(by_ts)]


def compact_rows(result: SimulationResult, reference: BubbleReference | None = None) -> list[Row]:
    """The compact trace's events as rows (see the module docstring): the few metadata events
    as dicts, the rest as their JSON text, built once rather than as tuples encoded later."""
    timeline = result.timeline
    rows: list[Row] = list(track_names(result, {ACTIONS_TID: "actions and idle time"}))
    intervals: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (rank, series) -> intervals
    # a transfer or sync ends no earlier than it starts, and rounding keeps that
    for src_rank, _, action, start_s, end_s in timeline.transfers:
        series = _ACTIVATIONS if action.kind == "F" else _GRADIENTS
        intervals[src_rank, series].append((round(start_s * 1e6), round(end_s * 1e6)))
    for sync in timeline.syncs:
        series = _OPTIMIZER if sync.kind == "optimizer" else _REDUCTIONS
        intervals[sync.rank, series].append((_us(sync.start_s), _us(sync.end_s)))
    for rank in range(timeline.num_ranks):
        points: list[tuple[int, int, float]] = []
        rows += _action_rows(result, rank, points)
        head = f'{{"ph":"X","pid":{rank},"tid":{ACTIONS_TID},"ts":'
        waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
        for idle_start_s, idle_end_s, kind in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
            start = round(idle_start_s * 1e6)
            rows.append(f'{head}{start},"dur":{round(idle_end_s * 1e6) - start},{_IDLE_JSON[kind]}')
        for series in (_ACTIVATIONS, _GRADIENTS, _REDUCTIONS, _OPTIMIZER):
            _levels(series, intervals.get((rank, series), []), points)
        rows += _streams(rank, points)
    return rows
