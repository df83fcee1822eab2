"""Idle time on a rank's compute stream, interval by interval, with its cause.

Within the pipeline window (from 0 until the last action on any rank ends) each gap
before an action is split, in time order, into:

* ``schedule``: the wait the same action has when every stage costs the same and
  communication is free (the schedule's own fill and drain: warm-up and cool-down);
* ``imbalance``: the rest of the wait for another stage's compute (unequal stages);
* ``transfer``: the input's producer had finished and its transfer was in flight
  (exposed pipeline communication);
* ``send``: waiting for the rank's own blocking sends to arrive;
* ``gather``: waiting for a chunk's parameters that FSDP's chunk window gathered again
  (``EngineInput.gathered_after``), after everything else the action needed was there.
  Not bubble: the summary counts it as exposed parameter-gather communication.

Without a reference run, waits for other stages are reported as ``schedule`` before the
first and after the last action and ``stage-wait`` in between.
"""

from __future__ import annotations

from typing import NamedTuple

from mpsim.engine.timeline import ROUNDING, Timeline

KINDS = ("schedule", "imbalance", "stage-wait", "transfer", "send", "gather")


class Idle(NamedTuple):
    """One idle interval on one rank."""

    start_s: float
    end_s: float
    kind: str


def _split(start: float, end: float, structural: float | None, fallback: str) -> list[Idle]:
    """A wait for another stage: the structural part first, then the imbalance."""
    if end <= start:
        return []
    if structural is None:
        return [Idle(start, end, fallback)]
    cut = min(end, start + max(0.0, structural))
    parts = [Idle(start, cut, "schedule")] if cut > start else []
    if end > cut:
        parts.append(Idle(cut, end, "imbalance"))
    return parts


def idle_intervals(timeline: Timeline, rank: int, pipeline_end_s: float,
                   reference: tuple[tuple[float, ...], float] | None = None) -> list[Idle]:
    """Idle intervals of ``rank`` in time order; ``reference`` is (waits before each action, drain)."""
    records = timeline.actions[rank]
    waits, drain = reference if reference is not None else (None, None)
    if not records:
        return [Idle(0.0, pipeline_end_s, "schedule")] if pipeline_end_s > 0 else []
    sends = timeline.send_waits_of(rank)
    # each gather wait ends where its action starts (engine/core.py)
    gathers = {end: start for start, end in timeline.gather_waits_of(rank)}
    noise_s = ROUNDING * pipeline_end_s  # a gap within rounding of the step's times is none
    gaps = _split(0.0, records[0].start_s, waits[0] if waits else None, "schedule")
    send_index = 0
    for index in range(1, len(records)):
        record = records[index]
        cursor = records[index - 1].end_s
        while send_index < len(sends) and sends[send_index][0] < record.start_s:
            start, end = sends[send_index]
            if end > start:
                gaps.append(Idle(start, end, "send"))
            cursor = max(cursor, end)
            send_index += 1
        if record.start_s <= cursor + noise_s:
            continue
        begin = record.start_s
        gathered_from = gathers.get(begin) if gathers else None
        if gathered_from is not None:
            begin = max(cursor, gathered_from)
        sent = record.input_sent_s
        # the part of the wait after the producer had finished is the transfer in flight
        transfer_from = begin if sent is None else max(cursor, min(sent, begin))
        gaps += _split(cursor, transfer_from, waits[index] if waits else None, "stage-wait")
        if begin > transfer_from:
            gaps.append(Idle(transfer_from, begin, "transfer"))
        if record.start_s > begin:
            gaps.append(Idle(begin, record.start_s, "gather"))
    gaps += _split(records[-1].end_s, pipeline_end_s, drain, "schedule")
    return gaps


def idle_by_kind(intervals: list[Idle]) -> dict[str, float]:
    """Seconds of idle time per kind."""
    totals = dict.fromkeys(KINDS, 0.0)
    for interval in intervals:
        totals[interval.kind] += interval.end_s - interval.start_s
    return totals
