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
                           "tid": 0, "ts": _us(record.start_s), "dur": _us(record.end_s - record.start_s),
                           "args": {**_args(item), "waited_us": _us(record.start_s - record.ready_s)}})
            if not ops:
                continue
            for segment in cost.segments:
                events.append({"ph": "X", "name": segment.label, "cat": segment.category, "pid": record.rank,
                               "tid": _THREADS[segment.stream], "ts": _us(record.start_s + segment.offset_s),
                               "dur": _us(segment.duration_s)})
    for rank in range(timeline.num_ranks):
        waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
        for idle in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
            events.append({"ph": "X", "name": f"idle: {idle.kind}", "cat": "idle", "pid": rank, "tid": 0,
                           "ts": _us(idle.start_s), "dur": _us(idle.end_s - idle.start_s)})
    for transfer in result.timeline.transfers:
        events.append({"ph": "X", "name": f"send {transfer.action} to rank {transfer.dst_rank}", "cat": "pp-comm",
                       "pid": transfer.src_rank, "tid": _THREADS["pp"], "ts": _us(transfer.start_s),
                       "dur": _us(transfer.end_s - transfer.start_s)})
    for sync in result.timeline.syncs:
        events.append({"ph": "X", "name": sync.label, "cat": sync.kind, "pid": sync.rank, "tid": _THREADS["dp"],
                       "ts": _us(sync.start_s), "dur": _us(sync.end_s - sync.start_s)})
    return events


def write_trace(result: SimulationResult, path: str, ops: bool = True,
                reference: BubbleReference | None = None) -> None:
    """Write the Chrome trace JSON to ``path``."""
    with open(path, "w") as handle:
        json.dump({"traceEvents": trace_events(result, ops, reference), "displayTimeUnit": "ms"}, handle)
