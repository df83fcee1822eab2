"""The discrete-event engine: one SimPy process per pipeline rank.

Each process walks its rank's action list. Before an action it waits for its input
(the previous stage's activation for ``F``, the next stage's gradient for ``B``/``I``),
then holds the rank's compute stream for the action's duration, then hands its output
to the link towards the consumer. A link carries one transfer at a time; with blocking
sends (Megatron's batched isend/irecv + wait) the rank does not start its next action
until its sends have arrived.

Data-parallel gradient buckets go on a separate stream per rank as soon as the last
backward of their stage has produced them, overlapping the rest of the backward pass;
the optimizer step follows when the rank's gradients are synchronized.

The engine knows actions, seconds and ranks only. Symmetry collapse happens upstream:
one simulated rank stands for its whole TP group and every DP replica, whose collectives
are already priced into the durations it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import simpy

from mpsim.engine.timeline import ActionRecord, SyncRecord, Timeline, TransferRecord
from mpsim.schedules.actions import Action, Item, Overlapped, Schedule, parts


@dataclass(frozen=True)
class GradBucket:
    """A DP gradient bucket: ready after ``ready_fraction`` of the stage's last backward."""

    ready_fraction: float
    duration_s: float
    label: str = "grad bucket"


@dataclass(frozen=True)
class EngineInput:
    """Plain numbers the engine runs on."""

    schedule: Schedule
    # seconds on the compute stream: (stage, kind) for an action, (forward stage, "F",
    # backward stage, backward kind) for an overlapped pair
    action_s: Mapping[tuple, float]
    transfer_s: Mapping[tuple[int, int], float]  # (from_stage, to_stage) -> seconds on the link
    grad_buckets: Mapping[int, tuple[GradBucket, ...]] = field(default_factory=dict)  # stage -> buckets
    overlap_grad_sync: bool = True
    pair_syncs: tuple[tuple[int, int, float, str], ...] = ()  # (rank a, rank b, seconds, label) after DP sync
    finalize_s: tuple[float, ...] = ()  # per rank, after all syncs (optimizer step)
    send_blocking: bool = False
    # reductions an action starts on the DP stream every time it runs (ZeRO-2/3), by duration key
    action_buckets: Mapping[tuple, tuple[GradBucket, ...]] = field(default_factory=dict)


def duration_key(item: Item) -> tuple:
    """The key of an item's duration in ``EngineInput.action_s``."""
    if isinstance(item, Overlapped):
        return (item.forward.stage, "F", item.backward.stage, item.backward.kind)
    return (item.stage, item.kind)


def _input_of(action: Action, num_stages: int) -> tuple[str, int, int] | None:
    """Key of the remote data an action consumes: ('act'|'grad', stage, microbatch)."""
    stage, kind, mb = action
    if kind == "F" and stage > 0:
        return ("act", stage, mb)
    if kind in ("B", "I") and stage < num_stages - 1:
        return ("grad", stage, mb)
    return None


def _output_of(action: Action, num_stages: int) -> tuple[tuple[str, int, int], int] | None:
    """(key, consuming stage) of the data an action produces for another stage."""
    stage, kind, mb = action
    if kind == "F" and stage < num_stages - 1:
        return ("act", stage + 1, mb), stage + 1
    if kind in ("B", "I") and stage > 0:
        return ("grad", stage - 1, mb), stage - 1
    return None


class _Run:
    """State of one simulation; ``execute`` drives it."""

    def __init__(self, inp: EngineInput):
        self.inp = inp
        self.env = simpy.Environment()
        self.schedule = inp.schedule
        self.waiting: dict[tuple[str, int, int], simpy.Event] = {}
        self.arrival: dict[tuple[str, int, int], float] = {}
        self.sent_at: dict[tuple[str, int, int], float] = {}
        self.link_free: dict[tuple[int, int], float] = {}
        self.timeline = Timeline(self.schedule.num_ranks, actions=[[] for _ in range(self.schedule.num_ranks)])
        self.grad_done = [0.0] * self.schedule.num_ranks
        # index of the action after which a stage's gradients are final, per rank
        self.last_backward: dict[tuple[int, int], int] = {}
        for rank, actions in enumerate(self.schedule.actions):
            for index, item in enumerate(actions):
                for action in parts(item):
                    if action.kind in ("B", "W"):
                        self.last_backward[(rank, action.stage)] = index

    def _deliver(self, key: tuple[str, int, int], at: float) -> None:
        """Make ``key`` available at time ``at``: wake its waiting consumer, or note the time."""
        waiting = self.waiting.pop(key, None)
        if waiting is None:
            self.arrival[key] = at
        else:
            # trigger the consumer's own event at ``at``: one event per transfer, no helper timeout
            waiting._ok = True
            waiting._value = None
            self.env.schedule(waiting, delay=at - self.env.now)

    def _plan(self, rank: int) -> list[tuple]:
        """Everything about each item of a rank that does not depend on time, computed once.

        Per item: the item, its duration, the remote inputs it waits for, the outputs it
        sends (key, consumer rank, link, transfer seconds, producing action), the
        reductions it starts on the DP stream, and the stages whose gradients it completes.
        """
        inp, num_stages = self.inp, self.schedule.num_stages
        stage_to_rank = self.schedule.stage_to_rank
        plan = []
        for index, item in enumerate(self.schedule.actions[rank]):
            inputs, outputs, completes = [], [], []
            for action in parts(item):
                key = _input_of(action, num_stages)
                if key is not None and stage_to_rank[key[1] + (-1 if key[0] == "act" else 1)] != rank:
                    inputs.append(key)  # produced on another rank (same-rank inputs come earlier in the list)
                produced = _output_of(action, num_stages)
                if produced is not None and stage_to_rank[produced[1]] != rank:
                    consumer = stage_to_rank[produced[1]]
                    outputs.append((produced[0], consumer, (rank, consumer),
                                    inp.transfer_s.get((action.stage, produced[1]), 0.0), action))
                if inp.overlap_grad_sync and self.last_backward.get((rank, action.stage)) == index:
                    completes.append(action.stage)
            key = duration_key(item)
            plan.append((item, inp.action_s[key], tuple(inputs), tuple(outputs),
                         inp.action_buckets.get(key, ()), tuple(completes)))
        return plan

    def _rank(self, rank: int):
        env, inp = self.env, self.inp
        records = self.timeline.actions[rank]
        transfers = self.timeline.transfers
        dp_free = 0.0
        sends_done = 0.0
        for index, (item, duration, inputs, outputs, buckets, completes) in enumerate(self._plan(rank)):
            if inp.send_blocking and sends_done > env.now:
                wait_from = env.now
                yield env.timeout(sends_done - env.now)
                self.timeline.send_waits.append((rank, wait_from, env.now))
            ready = env.now
            sent = None
            for key in inputs:
                at = self.arrival.pop(key, None)
                if at is None:
                    event = self.waiting[key] = env.event()
                    yield event
                elif at > env.now:
                    yield env.timeout(at - env.now)
                sent = self.sent_at[key] if sent is None else max(sent, self.sent_at[key])
            start = env.now
            if duration > 0:
                yield env.timeout(duration)
            end = env.now
            records.append(ActionRecord(rank, index, item, ready, start, end, sent))
            if buckets:
                dp_free = self._start_buckets(rank, buckets, start, end, dp_free, f"{item}")
            for out_key, consumer, link, seconds, action in outputs:
                tx_start = max(end, self.link_free.get(link, 0.0))
                tx_end = tx_start + seconds
                self.link_free[link] = tx_end
                self.sent_at[out_key] = end
                transfers.append(TransferRecord(rank, consumer, action, tx_start, tx_end))
                self._deliver(out_key, tx_end)
                if tx_end > sends_done:
                    sends_done = tx_end
            for stage in completes:
                dp_free = self._sync_buckets(rank, stage, start, end, dp_free)
        if inp.send_blocking and sends_done > env.now:
            wait_from = env.now
            yield env.timeout(sends_done - env.now)
            self.timeline.send_waits.append((rank, wait_from, env.now))
        if not inp.overlap_grad_sync:
            last = records[-1].end_s if records else 0.0
            stages = sorted({a.stage for item in self.schedule.actions[rank] for a in parts(item)}, reverse=True)
            for stage in stages:
                dp_free = self._sync_buckets(rank, stage, last, last, dp_free)
        self.grad_done[rank] = max(dp_free, records[-1].end_s if records else 0.0)

    def _sync_buckets(self, rank: int, stage: int, start: float, end: float, dp_free: float) -> float:
        return self._start_buckets(rank, self.inp.grad_buckets.get(stage, ()), start, end, dp_free, f"stage {stage}")

    def _start_buckets(self, rank: int, buckets: tuple[GradBucket, ...], start: float, end: float, dp_free: float,
                       label: str) -> float:
        """Queue reductions on the rank's DP stream as an action running start..end produces them."""
        for bucket in buckets:
            ready = start + bucket.ready_fraction * (end - start)
            begin = max(ready, dp_free)
            dp_free = begin + bucket.duration_s
            if bucket.duration_s > 0:
                self.timeline.syncs.append(SyncRecord(rank, "dp-comm", f"{label} {bucket.label}", begin, dp_free))
        return dp_free

    def execute(self) -> Timeline:
        for rank in range(self.schedule.num_ranks):
            self.env.process(self._rank(rank))
        self.env.run()
        unfinished = [r for r in range(self.schedule.num_ranks)
                      if len(self.timeline.actions[r]) != len(self.schedule.actions[r])]
        if unfinished:
            rank = unfinished[0]
            stuck = self.schedule.actions[rank][len(self.timeline.actions[rank])]
            raise RuntimeError(f"simulation stalled: rank {rank} never ran {stuck}")
        self._finalize()
        return self.timeline

    def _finalize(self) -> None:
        """Cross-rank syncs after gradient reduction (tied embeddings), then the optimizer."""
        done = list(self.grad_done)
        for a, b, seconds, label in self.inp.pair_syncs:
            begin = max(done[a], done[b])
            for rank in (a, b):
                self.timeline.syncs.append(SyncRecord(rank, "embedding-sync", label, begin, begin + seconds))
                done[rank] = begin + seconds
        ends = []
        for rank, ready in enumerate(done):
            seconds = self.inp.finalize_s[rank] if self.inp.finalize_s else 0.0
            if seconds > 0:
                self.timeline.syncs.append(SyncRecord(rank, "optimizer", "optimizer step", ready, ready + seconds))
            ends.append(ready + seconds)
        self.timeline.rank_end_s = ends


def simulate(inp: EngineInput) -> Timeline:
    """Run one training step of ``inp.schedule`` and return its timeline."""
    return _Run(inp).execute()
