"""Contention that changes nothing: the longest path for inputs whose shared links never carry two flows.

With ``transfer_links`` the SimPy engine shares each link's bandwidth between the flows
on it at the moment (``links.py``): a pipeline send starts when its producer ends and
moves at the rate of its most shared link, and DP buckets load the links they share
with sends. The longest-path evaluators do not model that; they give each rank pair a
link of its own, used by one transfer at a time in the sender's order.

Most steps never put two flows on one link at once: a 1F1B rank sends one activation or
one gradient per action, and by the time it sends the next the last has landed. Then the
two models agree, and the cheap one can answer. Three checks on the timeline evaluated
without contention decide it:

1. every pipeline transfer starts when the action producing it ends (no send waited
   behind an earlier one on its rank pair's link: with contention they would have
   shared the link from the start instead);
2. on every shared link, the intervals of the transfers and DP reductions that load it
   never overlap (touching is allowed). A DP reduction is taken to load every link that
   any reduction of its rank loads: that can only find more overlaps, never fewer;
3. with blocking sends, a rank that waits for its own sends after its last action
   finishes that wait before its DP stream drains, and its stages' reductions were queued
   during the backward (with contention the engine closes the stream, and queues the
   reductions kept for the end, after that wait; without, at the last action's end).

Each transfer's time must also be the same in both descriptions (latency plus time on
the wire equals ``transfer_s``, to 1e-12 relative), so that sampled or scaled transfer
times are never mixed with unscaled link specs.

If all hold, the SimPy run with contention makes the same decisions at the same times:
the first difference between the two runs would need a link carrying two flows at once,
and the checks show that the run without contention never reaches such a moment. Flows
alone on their links take exactly their priced time; DP buckets that the contended
engine sends as one flow end where the sequential ones do, to rounding. Otherwise the
SimPy engine runs. ``tests/test_uncontended.py`` holds both to each other on random
contended inputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from mpsim.engine.compiled import simulate_compiled
from mpsim.engine.core import EngineInput, simulate
from mpsim.engine.longest_path import supports
from mpsim.engine.timeline import Timeline
from mpsim.schedules.actions import parts

_SAME_TIME = 1e-12  # relative: latency + wire time against the input's transfer time


def simulate_uncontended(inp: EngineInput, engine: Callable[[EngineInput], Timeline] = simulate) -> Timeline:
    """The timeline of ``inp`` as the SimPy engine gives it, from the longest path wherever
    that gives the same (module doc); ``engine`` (the SimPy engine, or a faster evaluator of
    the same input: ``excise.simulate_excised``) otherwise."""
    if supports(inp):
        return simulate_compiled(inp)
    links = inp.transfer_links
    if links is None or not _same_transfer_times(inp):
        return engine(inp)
    plain = replace(inp, transfer_links=None)
    if not supports(plain):
        return engine(inp)
    timeline = simulate_compiled(plain)
    if not links_never_shared(inp, timeline):
        return engine(inp)
    return timeline


def _same_transfer_times(inp: EngineInput) -> bool:
    for key, spec in inp.transfer_links.items():
        seconds = inp.transfer_s.get(key, 0.0)
        if abs(spec.latency_s + spec.busy_s - seconds) > _SAME_TIME * max(abs(seconds), 1e-30):
            return False
    return True


def links_never_shared(inp: EngineInput, timeline: Timeline) -> bool:
    """Whether ``timeline``, evaluated without contention, is also the run with ``inp.transfer_links``
    (checks 1 to 3 of the module doc)."""
    schedule, links = inp.schedule, inp.transfer_links
    chains = schedule.topology
    ended: dict = {}  # producing action -> when its item ended
    for records in timeline.actions:
        for record in records:
            for action in parts(record.action):
                ended[action] = record.end_s
    loads: dict = {}  # link -> [(start, end), ...]
    for transfer in timeline.transfers:
        action = transfer.action
        if transfer.start_s != ended[action]:
            return False  # it waited behind another send on its rank pair's link (check 1)
        after = chains.next(action.stage) if action.kind == "F" else chains.previous(action.stage)
        spec = links.get((action.stage, after))
        if spec is None:
            return False
        if transfer.end_s > transfer.start_s:
            for link in spec.links:
                loads.setdefault(link, []).append((transfer.start_s, transfer.end_s))
    reduction_links = _reduction_links(inp)
    for sync in timeline.syncs:
        if sync.kind == "dp-comm" and sync.end_s > sync.start_s:
            for link in reduction_links.get(sync.rank, ()):
                loads.setdefault(link, []).append((sync.start_s, sync.end_s))
    for intervals in loads.values():  # check 2
        intervals.sort()
        busy_until = float("-inf")
        for start, end in intervals:
            if start < busy_until:
                return False
            busy_until = max(busy_until, end)
    if inp.send_blocking:  # check 3
        stream_end: dict[int, float] = {}
        for sync in timeline.syncs:
            if sync.kind == "dp-comm" and sync.end_s > stream_end.get(sync.rank, float("-inf")):
                stream_end[sync.rank] = sync.end_s
        for rank, start, end in timeline.send_waits:
            records = timeline.actions[rank]
            last = records[-1].end_s if records else 0.0
            if start >= last and (not inp.overlap_grad_sync or end > max(last, stream_end.get(rank, last))):
                return False
    return True


def _reduction_links(inp: EngineInput) -> dict[int, set]:
    """Per rank, every link any of its DP reductions (stage buckets or per-action ones) loads."""
    rank_of = inp.schedule.stage_to_rank
    found: dict[int, set] = {}
    for stage, buckets in inp.grad_buckets.items():
        for bucket in buckets:
            found.setdefault(rank_of[stage], set()).update(bucket.links)
    for key, buckets in inp.action_buckets.items():
        for bucket in buckets:
            found.setdefault(rank_of[key[0]], set()).update(bucket.links)
    return found
