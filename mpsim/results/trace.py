"""Chrome trace-event JSON of a simulated step, which Perfetto and chrome://tracing open.

One process per pipeline rank, one thread per stream: compute, TP collectives,
pipeline sends, DP gradient reduction (and the optimizer). Each action appears as a
slice with its ops nested inside, so zooming in shows every GEMM and collective.
"""

from __future__ import annotations

import json
from typing import Any

from mpsim.results.idle import idle_intervals
from mpsim.schedules.actions import Item, Overlapped, parts
from mpsim.simulate import BubbleReference, SimulationResult

_THREADS = {"compute": 0, "tp": 1, "pp": 2, "dp": 3}
_THREAD_NAMES = {0: "compute", 1: "TP collectives", 2: "pipeline sends", 3: "DP gradients / optimizer"}
_KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)"}


def _category(item: Item) -> str:
    if isinstance(item, Overlapped):
        return "forward+backward (overlapped)"
    return _KIND_NAMES[item.kind]


def _args(item: Item) -> dict[str, Any]:
    return {"actions": [{"stage": a.stage, "kind": a.kind, "microbatch": a.microbatch} for a in parts(item)]}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _span(start_s: float, end_s: float, within: tuple[int, int] | None = None) -> dict[str, float]:
    """``ts`` and ``dur`` in microseconds from whole nanoseconds, the end rounded on its own (not
    start plus a rounded duration), so a slice that ends where another ends or starts still does
    after rounding; ``within`` (the enclosing slice, in ns) keeps a nested slice inside it
    where float addition put it a fraction of a nanosecond outside. Perfetto drops a slice that
    overruns its parent on the same track."""
    start, end = _ns(start_s), _ns(end_s)
    if within is not None:
        start, end = max(start, within[0]), min(end, within[1])
    return {"ts": start / 1e3, "dur": max(0, end - start) / 1e3}


def trace_events(result: SimulationResult, ops: bool = True,
                 reference: BubbleReference | None = None) -> list[dict[str, Any]]:
    """Trace events (``ph: X`` slices plus process/thread names)."""
    events: list[dict[str, Any]] = []
    schedule = result.schedule
    for rank in range(schedule.num_ranks):
        stages = [s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank]
        events.append({"ph": "M", "name": "process_name", "pid": rank,
                       "args": {"name": f"pp rank {rank} (stage {', '.join(map(str, stages))})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for tid, name in _THREAD_NAMES.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    timeline = result.timeline
    for records in timeline.actions:
        for record in records:
            item = record.action
            cost = result.cost(item)
            events.append({"ph": "X", "name": str(item), "cat": _category(item), "pid": record.rank,
                           "tid": 0, **_span(record.start_s, record.end_s),
                           "args": {**_args(item), "waited_us": _us(record.start_s - record.ready_s)}})
            if not ops:
                continue
            # the compute stream runs its ops back to back inside the action: each starts no
            # earlier than the last one ended (their offsets are float sums that can disagree
            # by a fraction of a nanosecond) and ends within the action
            free_ns, action_end_ns = _ns(record.start_s), _ns(record.end_s)
            for segment in cost.segments:
                tid = _THREADS[segment.stream]
                start = record.start_s + segment.offset_s
                span = _span(start, start + segment.duration_s, (free_ns, action_end_ns) if tid == 0 else None)
                if tid == 0:
                    free_ns = round((span["ts"] + span["dur"]) * 1e3)
                events.append({"ph": "X", "name": segment.label, "cat": segment.category, "pid": record.rank,
                               "tid": tid, **span})
    for rank in range(timeline.num_ranks):
        waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
        for idle in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
            events.append({"ph": "X", "name": f"idle: {idle.kind}", "cat": "idle", "pid": rank, "tid": 0,
                           **_span(idle.start_s, idle.end_s)})
    for transfer in result.timeline.transfers:
        events.append({"ph": "X", "name": f"send {transfer.action} to rank {transfer.dst_rank}", "cat": "pp-comm",
                       "pid": transfer.src_rank, "tid": _THREADS["pp"], **_span(transfer.start_s, transfer.end_s)})
    for sync in result.timeline.syncs:
        events.append({"ph": "X", "name": sync.label, "cat": sync.kind, "pid": sync.rank, "tid": _THREADS["dp"],
                       **_span(sync.start_s, sync.end_s)})
    return events + _spread_concurrent(events)


def _spread_concurrent(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put communication slices that run at the same time on one rank's stream (the two passes
    of an overlapped DualPipe pair, sends to both neighbours) on tracks of their own: one track
    holds slices that follow each other, as Perfetto requires. Returns the new tracks' names."""
    lanes: dict[tuple[int, int], list[int]] = {}  # (pid, tid) -> the end (ns) of each lane's last slice
    named: list[dict[str, Any]] = []
    slices = [e for e in events if e.get("ph") == "X" and e["tid"] != _THREADS["compute"]]
    for event in sorted(slices, key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"])):
        key = (event["pid"], event["tid"])
        start, end = round(event["ts"] * 1e3), round((event["ts"] + event["dur"]) * 1e3)
        ends = lanes.setdefault(key, [])
        lane = next((i for i, last in enumerate(ends) if last <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
            if lane:
                named.append({"ph": "M", "name": "thread_name", "pid": key[0], "tid": _lane_tid(key[1], lane),
                              "args": {"name": f"{_THREAD_NAMES[key[1]]} ({lane + 1})"}})
        ends[lane] = end
        event["tid"] = _lane_tid(key[1], lane)
    return named


def _lane_tid(tid: int, lane: int) -> int:
    return tid if lane == 0 else 10 * tid + lane


def write_trace(result: SimulationResult, path: str, ops: bool = True,
                reference: BubbleReference | None = None) -> None:
    """Write the Chrome trace JSON to ``path``."""
    with open(path, "w") as handle:
        json.dump({"traceEvents": trace_events(result, ops, reference), "displayTimeUnit": "ms"}, handle)
