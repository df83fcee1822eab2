"""Chrome trace-event JSON of a simulated step, which Perfetto and chrome://tracing open.

Two forms of the same step (docs/traces.md):

* full: one process per pipeline rank, one thread per stream: compute, TP collectives,
  pipeline sends, DP gradient reduction (and the optimizer). Each action appears as a
  slice with its ops nested inside, so zooming in shows every GEMM and collective.
* compact (``trace_compact.py``): whole actions on one track per pipeline rank, with
  collectives, pipeline transfers and the DP stream as counters. A large job's full
  trace holds millions of slices; past ``FULL_TRACE_SLICE_LIMIT`` the compact form is
  chosen unless the full one is asked for.

Either way a process is one simulated pipeline rank, standing for its whole TP, CP and
DP group as the engine does. The full trace's events are built as tuples of integer
nanoseconds, the compact trace's as their JSON text; ``trace_writer.py`` writes either,
and ``trace_events`` gives the same events as dicts.
"""

from __future__ import annotations

import os
from typing import Any

from mpsim.engine.core import cyclic_gc_paused, duration_key
from mpsim.results.idle import idle_intervals
from mpsim.results.trace_compact import action_category, compact_rows
from mpsim.results.trace_writer import Row, as_dict, track_names, write_rows
from mpsim.schedules.actions import parts
from mpsim.simulate import BubbleReference, SimulationResult

# Past this many slices (one per action, per op, per pipeline transfer and per DP sync;
# idle gaps not counted) the full trace is about 25 MB of JSON and takes seconds to write
# and to load; the compact form is written instead unless the full one is asked for.
FULL_TRACE_SLICE_LIMIT = 250_000

_THREADS = {"compute": 0, "tp": 1, "pp": 2, "dp": 3}
_THREAD_NAMES = {0: "compute", 1: "TP collectives", 2: "pipeline sends", 3: "DP gradients / optimizer"}


def whole_ns(seconds: float) -> int:
    """Seconds as whole nanoseconds (traces and the HTML report count time in them)."""
    return round(seconds * 1e9)


def _slice(pid: int, tid: int, start_s: float, end_s: float, name: str, category: str,
           args: dict[str, Any] | None = None) -> Row:
    """Start and end rounded to whole nanoseconds each on its own (not the start plus a rounded
    duration), so a slice that ends where another ends or starts still does after rounding."""
    start, end = whole_ns(start_s), whole_ns(end_s)
    return ("X", pid, tid, start, max(start, end), name, category, args)


def full_slice_count(result: SimulationResult, ops: bool = True) -> int:
    """Slices of the full trace, idle gaps not counted: what ``FULL_TRACE_SLICE_LIMIT`` bounds."""
    timeline = result.timeline
    count = sum(len(records) for records in timeline.actions) + len(timeline.transfers) + len(timeline.syncs)
    if ops:
        count += sum(len(result.cost(record.action).segments) for records in timeline.actions for record in records)
    return count


def chosen_mode(result: SimulationResult, ops: bool = True, requested: str = "auto",
                limit: int | None = None) -> tuple[str, str | None]:
    """``"full"`` or ``"compact"`` for ``requested`` (``"auto"``, ``"full"``, ``"compact"``), and
    a note when ``"auto"`` chose the compact form because the full one is past ``limit`` slices
    (``FULL_TRACE_SLICE_LIMIT`` unless given)."""
    if requested not in ("auto", "full", "compact"):
        raise ValueError(f"unknown trace form {requested!r}")
    if requested != "auto":
        return requested, None
    limit = FULL_TRACE_SLICE_LIMIT if limit is None else limit
    slices = full_slice_count(result, ops)
    if slices <= limit:
        return "full", None
    return "compact", (f"the full trace would hold {slices:,} slices, more than {limit:,}: writing the compact "
                       f"trace (whole actions per pipeline rank, communication as counters); --trace-full "
                       f"writes every op")


def _full_rows(result: SimulationResult, ops: bool, reference: BubbleReference | None) -> list[Row]:
    rows: list[Row] = list(track_names(result, _THREAD_NAMES))
    append = rows.append
    timeline = result.timeline
    # each priced action's ops as plain tuples, read once: a large step repeats a few hundred
    # priced actions over millions of op slices (duration_key: the actions that share a price)
    ops_of: dict[tuple, tuple[tuple[int, float, float, str, str], ...]] = {}
    for records in timeline.actions:
        for record in records:
            item = record.action
            action = _slice(record.rank, 0, record.start_s, record.end_s, str(item), action_category(item), {
                "actions": [{"stage": a.stage, "kind": a.kind, "microbatch": a.microbatch} for a in parts(item)],
                "waited_us": round((record.start_s - record.ready_s) * 1e6, 3)})
            append(action)
            if not ops:
                continue
            key = duration_key(item)
            segments = ops_of.get(key)
            if segments is None:
                segments = ops_of[key] = tuple((_THREADS[s.stream], s.offset_s, s.duration_s, s.label, s.category)
                                               for s in result.costs[key].segments)
            # the compute stream runs its ops back to back inside the action: each starts no
            # earlier than the last one ended (their offsets are float sums that can disagree
            # by a fraction of a nanosecond) and ends within the action, or Perfetto drops it;
            # times in whole nanoseconds as whole_ns rounds them, written out for speed
            free_ns, action_end_ns = action[3], action[4]
            rank, start_s = record.rank, record.start_s
            for tid, offset_s, duration_s, label, category in segments:
                op_start_s = start_s + offset_s
                start, end = round(op_start_s * 1e9), round((op_start_s + duration_s) * 1e9)
                if tid == 0:
                    if start < free_ns:
                        start = free_ns
                    if end > action_end_ns:
                        end = action_end_ns
                    free_ns = end = end if end > start else start
                elif end < start:
                    end = start
                append(("X", rank, tid, start, end, label, category, None))
    for rank in range(timeline.num_ranks):
        waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
        for idle in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
            rows.append(_slice(rank, 0, idle.start_s, idle.end_s, f"idle: {idle.kind}", "idle"))
    for transfer in timeline.transfers:
        rows.append(_slice(transfer.src_rank, _THREADS["pp"], transfer.start_s, transfer.end_s,
                           f"send {transfer.action} to rank {transfer.dst_rank}", "pp-comm"))
    for sync in timeline.syncs:
        rows.append(_slice(sync.rank, _THREADS["dp"], sync.start_s, sync.end_s, sync.label, sync.kind))
    return rows + _spread_concurrent(rows)


def _spread_concurrent(rows: list[Row]) -> list[Row]:
    """Put communication slices that run at the same time on one rank's stream (the two passes
    of an overlapped DualPipe pair, sends to both neighbours) on tracks of their own: one track
    holds slices that follow each other, as Perfetto requires. Moves them in ``rows`` and
    returns the new tracks' names."""
    lanes: dict[tuple[int, int], list[int]] = {}  # (pid, tid) -> the end (ns) of each lane's last slice
    named: list[Row] = []
    # (pid, tid, start, -duration, index) of each slice off the compute stream
    comm = sorted((row[1], row[2], row[3], row[3] - row[4], i) for i, row in enumerate(rows)
                  if type(row) is tuple and row[2] != _THREADS["compute"])
    for pid, tid, start, _, index in comm:
        end = rows[index][4]
        ends = lanes.setdefault((pid, tid), [])
        # the first lane free by then; nearly always the first lane, which is looked at first
        lane = 0 if not ends or ends[0] <= start else next(
            (i for i, last in enumerate(ends) if last <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
            if lane:
                named.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": _lane_tid(tid, lane),
                              "args": {"name": f"{_THREAD_NAMES[tid]} ({lane + 1})"}})
        ends[lane] = end
        if lane:
            row = rows[index]
            rows[index] = row[:2] + (_lane_tid(tid, lane),) + row[3:]
    return named


def _lane_tid(tid: int, lane: int) -> int:
    return tid if lane == 0 else 10 * tid + lane


def trace_rows(result: SimulationResult, ops: bool = True, reference: BubbleReference | None = None,
               compact: bool = False) -> list[Row]:
    """The trace's events as rows (tuples and metadata dicts, ``trace_writer.Row``)."""
    return compact_rows(result, reference) if compact else _full_rows(result, ops, reference)


def trace_events(result: SimulationResult, ops: bool = True, reference: BubbleReference | None = None,
                 compact: bool = False) -> list[dict[str, Any]]:
    """Trace events as dicts, as a JSON reader gets them back from the written file."""
    with cyclic_gc_paused():  # millions of dicts and tuples, none in a cycle (write_trace)
        return [as_dict(row) for row in trace_rows(result, ops, reference, compact)]


def write_trace(result: SimulationResult, path: str | os.PathLike, ops: bool = True,
                reference: BubbleReference | None = None, compact: bool = False) -> None:
    """Write the Chrome trace JSON to ``path`` (gzip-compressed when it ends in ``.gz``)."""
    # hundreds of thousands of tuples, none of them in a reference cycle: the cycle collector
    # would walk them again and again as they pile up, for nothing (a fifth of the time)
    with cyclic_gc_paused():
        write_rows(path, trace_rows(result, ops, reference, compact))
