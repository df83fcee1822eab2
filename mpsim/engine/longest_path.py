"""Step time as a longest path: the engine's semantics without an event queue.

The SimPy engine (``mpsim/engine/core.py``) is a max-plus system in disguise. Every
resource it models has exactly one writer, so nothing depends on the order in which
simultaneous events fire:

* a rank's compute stream runs its own list in order, so an item (an action, or an
  overlapped forward+backward pair) starts at
  ``max(previous end, own blocking sends done, arrival of each remote input)`` (with
  ``send_blocking_with_receive`` only an item with a remote input waits for the sends);
* a link ``(src, dst)`` carries only ``src``'s sends, in ``src``'s program order, so a
  transfer starts at ``max(producer end, link free)``;
* a rank's DP stream reduces its own buckets in order: ``max(bucket ready, stream free)``,
  those an action starts each time it runs (ZeRO-2/3) before a stage's final ones;
* pair syncs and the optimizer come after every rank's gradients are done.

So each time is a ``max`` of sums of earlier times: the longest path to that action
through the schedule's dependency graph. This module evaluates the recurrences directly:
it walks a rank's list until the rank needs an input not yet produced, parks the rank
on that input, and resumes it when the producer sends it. Every item is evaluated once
and the order of evaluation cannot change a time. Ranks still parked at the end are a
deadlock, reported the way the engine reports it.

It returns the same :class:`~mpsim.engine.Timeline` the engine returns: per-rank action
records, transfers, DP syncs, send waits and rank end times, so the results layer
(``mpsim.results.summarize``) works on it unchanged. Per-rank lists equal the engine's;
the global lists (transfers, syncs, send waits) may be in another order, which no
metric depends on. Times agree with the engine's to floating-point rounding (the engine
advances its clock by differences, ``now + (t - now)``; here ``t`` is used directly).

It runs two to five times faster than the engine, which is what lets the planner simulate
thousands of layouts and the zero-bubble search time its candidates (:func:`rank_spans`).
``supports`` says whether an input uses only what this module models; anything new in
``EngineInput`` is refused, so callers fall back to the engine.

The state lives in a :class:`Walk`, which can stop each rank at a given item and go on
later: ``steady.py`` walks a long pipeline layer by layer that way and jumps over the
layers that repeat. A schedule is read once into per-rank steps (``_plan``, cached), with
each stage's neighbours looked up once per stage rather than once per action.
"""

from __future__ import annotations

import dataclasses

from mpsim.engine.core import EngineInput, duration_key, finish_step
from mpsim.engine.dpstream import DPStreams
from mpsim.engine.timeline import ActionRecord, Timeline, TransferRecord
from mpsim.schedules.actions import Action, Overlapped, Schedule, flat, parts

# EngineInput fields whose meaning this module reproduces; a field added later is unknown
# to it, and an input that sets such a field to a non-default value goes to the engine.
MODELLED_FIELDS = frozenset({"schedule", "action_s", "transfer_s", "grad_buckets", "overlap_grad_sync",
                             "pair_syncs", "finalize_s", "send_blocking", "send_blocking_with_receive",
                             "action_buckets", "optimizer_chain", "optimizer_barrier"})
KINDS = frozenset({"F", "B", "I", "W"})


def supports(inp: EngineInput) -> bool:
    """True when every field of ``inp`` is one this module models (or left at its default)."""
    for spec in dataclasses.fields(inp):
        if spec.name in MODELLED_FIELDS:
            continue
        if spec.default is not dataclasses.MISSING:
            default = spec.default
        elif spec.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = spec.default_factory()  # type: ignore[misc]
        else:
            return False
        if getattr(inp, spec.name) != default:
            return False
    for items in inp.schedule.actions:
        for item in items:
            if not isinstance(item, (Action, Overlapped)) or any(a.kind not in KINDS for a in parts(item)):
                return False
    return True


# One item of a rank's list, resolved once per schedule:
#   (duration key, item, input slots, outputs)
# ``input slots`` are the slots of the remote inputs the item waits for (none when its
# inputs are produced on the same rank). ``outputs`` has one entry per part of the item
# (an overlapped pair has two) that sends data or finalizes a stage's gradients:
#   (slot or -1, consumer rank, consumer stage, stage, action, last backward of the stage)
# A slot is one (activation into a stage | gradient into a stage, microbatch). Plain
# tuples: the loop below unpacks one per item, and that is most of its time.
_Step = tuple


_PLANS: dict[int, tuple[Schedule, list[list[_Step]]]] = {}


def _stage_links(schedule: Schedule) -> list[tuple]:
    """Per stage: (slot base of its forward input or -1, of its backward input or -1,
    consumer (rank, stage, slot base) of its forward output or None, of its backward output or None).

    A slot base plus a microbatch is a slot; -1 or None where the neighbour is on the same
    rank (or there is none). Per stage once, so that a rank list is planned by lookups.
    """
    micro, chains, rank_of = schedule.num_microbatches, schedule.topology, schedule.stage_to_rank
    links = []
    for stage in range(schedule.num_stages):
        rank = rank_of[stage]
        before, after = chains.previous(stage), chains.next(stage)
        forward_in = (stage * 2) * micro if before is not None and rank_of[before] != rank else -1
        backward_in = (stage * 2 + 1) * micro if after is not None and rank_of[after] != rank else -1
        forward_out = (rank_of[after], after, (after * 2) * micro) if after is not None else None
        backward_out = (rank_of[before], before, (before * 2 + 1) * micro) if before is not None else None
        links.append((forward_in, backward_in, forward_out, backward_out))
    return links


def _plan(schedule: Schedule) -> list[list[_Step]]:
    """Per-rank steps of a schedule; cached because the planner reuses schedules."""
    cached = _PLANS.get(id(schedule))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    links = _stage_links(schedule)
    plan = []
    for rank, items in enumerate(schedule.actions):
        last = {}
        for index, item in enumerate(items):
            for action in parts(item):
                if action.kind in ("B", "W"):
                    last[action.stage] = index
        steps = []
        for index, item in enumerate(items):
            needs, outputs = [], []
            for action in parts(item):
                stage, kind, mb = action
                forward_in, backward_in, forward_out, backward_out = links[stage]
                if kind == "F":
                    if forward_in >= 0:
                        needs.append(forward_in + mb)
                    out = forward_out
                elif kind == "W":
                    out = None
                else:
                    if backward_in >= 0:
                        needs.append(backward_in + mb)
                    out = backward_out
                gives = consumer = consumer_stage = -1
                if out is not None:
                    consumer_stage = out[1]
                    if out[0] != rank:
                        consumer, gives = out[0], out[2] + mb
                last_backward = last.get(stage) == index
                if gives >= 0 or last_backward:
                    outputs.append((gives, consumer, consumer_stage, stage, action, last_backward))
            steps.append((duration_key(item), item, tuple(needs), tuple(outputs)))
        plan.append(steps)
    if len(_PLANS) > 64:  # keep the cache small; schedules are cheap to re-plan
        _PLANS.clear()
    _PLANS[id(schedule)] = (schedule, plan)
    return plan


NOT_YET = None  # arrival of a slot not produced yet (times may be negative once rebased: steady.py)


class Walk:
    """The recurrences' state, advanced rank by rank until every rank is done or waits.

    ``advance`` may stop each rank at a limit (an item index): ``mpsim/engine/steady.py``
    walks a schedule layer by layer that way, compares the state between layers and
    jumps over repeated ones. Times are relative to ``offset_s`` (0 unless rebased there);
    the records appended meanwhile carry relative times too, until ``steady.py`` shifts them.
    """

    def __init__(self, inp: EngineInput, plan: list[list[_Step]] | None = None, timeline: Timeline | None = None):
        schedule = inp.schedule
        self.inp, self.schedule = inp, schedule
        self.plan = plan if plan is not None else _plan(schedule)
        num_ranks = schedule.num_ranks
        slots = 2 * schedule.num_stages * schedule.num_microbatches
        self.arrival_s: list = [NOT_YET] * slots
        self.sent_s = [0.0] * slots
        self.timeline = timeline or Timeline(num_ranks, actions=[[] for _ in range(num_ranks)])
        self.position = [0] * num_ranks
        self.clock_s = [0.0] * num_ranks  # end of the rank's previous item
        self.sends_done_s = [0.0] * num_ranks
        # reductions in order, one at a time (no contention here)
        self.dp = DPStreams(self.timeline, num_ranks, inp.grad_buckets)
        self.link_free_s: dict[tuple[int, int], float] = {}

    def advance(self, limits: list[int] | None = None) -> None:
        """Evaluate items until each rank has run up to its limit (all of them: None) or waits
        for an input that no rank can produce yet. The order cannot change a time."""
        plan, timeline, inp = self.plan, self.timeline, self.inp
        arrival_s, sent_s, link_free_s = self.arrival_s, self.sent_s, self.link_free_s
        transfers, send_waits = timeline.transfers, timeline.send_waits
        action_s, transfer_s = inp.action_s, inp.transfer_s
        action_buckets, dp = inp.action_buckets, self.dp
        blocking, overlap = inp.send_blocking, inp.overlap_grad_sync
        with_receive = inp.send_blocking_with_receive
        position, clock_s, sends_done_s = self.position, self.clock_s, self.sends_done_s
        num_ranks = len(plan)
        # ranks ready to advance; a rank that needs an input not yet produced parks on its slot
        # and is woken by the rank that produces it, so each item is visited about once
        runnable = list(range(num_ranks - 1, -1, -1))
        parked: dict[int, int] = {}  # slot -> rank waiting for it
        while runnable:
            rank = runnable.pop()
            steps, records = plan[rank], timeline.actions[rank]
            count = len(steps) if limits is None else min(len(steps), limits[rank])
            index, now, sends_done = position[rank], clock_s[rank], sends_done_s[rank]
            while index < count:
                key, item, needs, outputs = steps[index]
                if needs:
                    missing = -1
                    for slot in needs:
                        if arrival_s[slot] is None:
                            missing = slot
                            break
                    if missing >= 0:
                        parked[missing] = rank  # another rank must produce it first
                        break
                if blocking and sends_done > now and (needs or not with_receive):
                    send_waits.append((rank, now, sends_done))
                    now = sends_done
                ready = now
                sent = None
                for slot in needs:
                    if arrival_s[slot] > now:
                        now = arrival_s[slot]
                    if sent is None or sent_s[slot] > sent:
                        sent = sent_s[slot]
                start = now
                now = start + action_s[key]
                records.append(ActionRecord(rank, index, item, ready, start, now, sent))
                if action_buckets:  # reductions the action itself starts (ZeRO-2/3), before its stage's final ones
                    queued = action_buckets.get(key)
                    if queued:
                        dp.add(rank, queued, start, now, f"{item}")
                for gives, consumer, consumer_stage, stage, action, last_backward in outputs:
                    if gives >= 0:
                        link = (rank, consumer)
                        free = link_free_s.get(link)
                        tx_start = now if free is None or free < now else free
                        tx_end = tx_start + transfer_s.get((stage, consumer_stage), 0.0)
                        link_free_s[link] = tx_end
                        sent_s[gives] = now
                        arrival_s[gives] = tx_end
                        transfers.append(TransferRecord(rank, consumer, action, tx_start, tx_end))
                        if tx_end > sends_done:
                            sends_done = tx_end
                        if gives in parked:
                            runnable.append(parked.pop(gives))
                    if overlap and last_backward:
                        dp.add_stage(rank, stage, start, now)
                index += 1
            position[rank], clock_s[rank], sends_done_s[rank] = index, now, sends_done

    def finish(self) -> Timeline:
        """After every item ran: the last send waits, the DP streams drained, pair syncs, the optimizer."""
        schedule, inp, timeline, dp = self.schedule, self.inp, self.timeline, self.dp
        plan, position = self.plan, self.position
        stuck = [r for r in range(schedule.num_ranks) if position[r] < len(plan[r])]
        if stuck:
            rank = stuck[0]
            raise RuntimeError(f"simulation stalled: rank {rank} never ran {schedule.actions[rank][position[rank]]}")
        for rank in range(schedule.num_ranks):
            records = timeline.actions[rank]
            last_end = records[-1].end_s if records else 0.0
            if inp.send_blocking and self.sends_done_s[rank] > self.clock_s[rank]:
                timeline.send_waits.append((rank, self.clock_s[rank], self.sends_done_s[rank]))
            if not inp.overlap_grad_sync:
                for stage in sorted({a.stage for a in flat(schedule.actions[rank])}, reverse=True):
                    dp.add_stage(rank, stage, last_end, last_end)
            dp.close(rank)
        finish_step(inp, timeline, dp.grad_done)
        return timeline


def simulate_fast(inp: EngineInput) -> Timeline:
    """The engine's timeline of ``inp``, computed as a longest path (see the module doc)."""
    walk = Walk(inp)
    walk.advance()
    return walk.finish()


def rank_spans(schedule: Schedule, action_s: dict[tuple[int, str], float],
               transfer_s: dict[tuple[int, int], float]) -> list[tuple[float, float]]:
    """Per rank, when its first action starts and its last ends, with fixed durations.

    ``action_s`` prices each (stage, kind), ``transfer_s`` each (source stage, destination
    stage) pair; nothing else is modelled. This is the timing function the zero-bubble
    search (``mpsim/schedules/zb_search.py``) takes for candidates it did not place itself.
    """
    records = simulate_fast(EngineInput(schedule, action_s, transfer_s)).actions
    return [(actions[0].start_s, actions[-1].end_s) for actions in records]
