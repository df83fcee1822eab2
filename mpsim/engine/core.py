"""The discrete-event engine: one SimPy process per pipeline rank.

Each process walks its rank's action list. Before an action it waits for its input
(the previous stage's activation for ``F``, the next stage's gradient for ``B``/``I``),
then holds the rank's compute stream for the action's duration, then hands its output
to the link towards the consumer. A link carries one transfer at a time; with blocking
sends (Megatron's batched isend/irecv + wait) the rank does not start its next action
until its sends have arrived, or, as the Zero Bubble fork batches them with the receive
the next pass consumes, its next action that receives an input.

Data-parallel gradient buckets go on a separate stream per rank as soon as the last
backward of their stage has produced them, overlapping the rest of the backward pass;
the optimizer step follows when the rank's gradients are synchronized.

The engine knows actions, seconds and ranks only. Symmetry collapse happens upstream:
one simulated rank stands for its whole TP group and every DP replica, whose collectives
are already priced into the durations it is given.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Mapping

import simpy

from mpsim.engine.dpstream import DPStreams, GradBucket
from mpsim.engine.links import Flow, SharedLinks
from mpsim.engine.timeline import ActionRecord, SyncRecord, Timeline, TransferRecord
from mpsim.schedules.actions import (Action, Item, Overlapped, Schedule, Unsharding, completing_items, parts,
                                     priced_kind)


@dataclass(frozen=True)
class TransferSpec:
    """A pipeline transfer under contention: latency, time on the wire when alone, links it uses."""

    latency_s: float
    busy_s: float
    links: tuple


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
    # (rank a, rank b, seconds, label) after DP sync; zero seconds only makes both wait for the later
    pair_syncs: tuple[tuple[int, int, float, str], ...] = ()
    finalize_s: tuple[float, ...] = ()  # per rank, after all syncs (optimizer step)
    send_blocking: bool = False
    # with send_blocking, only an action that receives an input from another rank waits for the
    # rank's sends (the Zero Bubble fork fuses a pass's sends with the receive the next pass
    # consumes and waits for the batch; a pass that receives nothing does not wait)
    send_blocking_with_receive: bool = False
    # reductions an action starts on the DP stream every time it runs (ZeRO-2/3), by duration key
    action_buckets: Mapping[tuple, tuple[GradBucket, ...]] = field(default_factory=dict)
    # with contention: (from_stage, to_stage) -> the transfer's links; transfers and DP buckets
    # that share a link share its bandwidth (links.py). None: each rank pair has its own link.
    transfer_links: Mapping[tuple[int, int], TransferSpec] | None = None
    # (rank, item index) -> the earliest the item may start: a step that follows another one
    # without a barrier between them (``engine/consecutive.py``)
    not_before_s: Mapping[tuple[int, int], float] = field(default_factory=dict)
    # each rank's optimizer step waits until the rank before it has reached its own (Zero Bubble's
    # post-validation passes the partial gradient norm and NaN check down the pipeline)
    optimizer_chain: bool = False
    # every rank's optimizer step waits for the last rank's gradients: a blocking reduction over all
    # pipeline ranks before the update (Megatron's global gradient norm, the fp16 inf/nan check)
    optimizer_barrier: bool = False
    # (rank, item index) -> ((earlier item index, seconds), ...): the item starts no earlier than
    # the seconds after the item before each earlier one started (FSDP's chunk window: the runtime
    # issues a chunk's gathers as soon as it has launched that item, so they run beside it, and
    # the chunk's next pass waits for them: schedules/unshard.py)
    gathered_after: Mapping[tuple[int, int], tuple[tuple[int, float], ...]] = field(default_factory=dict)


@contextmanager
def cyclic_gc_paused():
    """Pause Python's cycle collector while the engine runs.

    A run allocates a few hundred thousand small objects (events, flows, records, keys),
    and every 700 allocations the collector walks the young ones, many of which live
    for a while and die before the run ends. Paused, it walks only what is still alive
    afterwards: 7 % fewer instructions per Megatron 1T simulation. Reference counting
    frees objects as usual meanwhile, and the caller's setting is restored afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def duration_key(item: Item) -> tuple:
    """The key of an item's duration in ``EngineInput.action_s``: (stage, kind) for an action,
    (forward stage, "F", backward stage, backward kind) for an overlapped pair; an action that
    gathers its parameters first has kind ``"F+gather"`` and so on (``actions.Unsharding``)."""
    if isinstance(item, Overlapped):
        return (item.forward.stage, priced_kind(item.forward), item.backward.stage, priced_kind(item.backward))
    return (item.stage, priced_kind(item)) if type(item) is Unsharding else (item.stage, item.kind)


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
        # with contention, transfers and DP buckets are flows on shared links, and each
        # rank's DP stream works through a queue of buckets: one at a time, in order
        self.shared = SharedLinks(self.env) if inp.transfer_links is not None else None
        ranks = self.schedule.num_ranks
        # contention mode: transfers in flight, by the key of what they carry and by sender
        self.flow_of: dict[tuple[str, int, int], Flow] = {}
        self.sending: list[list[Flow]] = [[] for _ in range(self.schedule.num_ranks)]
        self.sends_landed = [0.0] * ranks  # when each rank's latest transfer landed
        self.timeline = Timeline(self.schedule.num_ranks, actions=[[] for _ in range(self.schedule.num_ranks)])
        self.dp = DPStreams(self.timeline, ranks, inp.grad_buckets, self.shared)

    def _deliver(self, key: tuple[str, int, int], at: float) -> None:
        """Make ``key`` available at time ``at``: wake its parked consumer, or note the time.

        With contention a transfer takes its parked consumer over when it starts
        (``_send_shared``); the consumer then wakes with the flow and finds the time noted.
        """
        waiting = self.waiting.pop(key, None)
        if waiting is None:
            self.arrival[key] = at
        else:
            # trigger the consumer's own event at ``at``: one event per transfer, no helper timeout
            waiting._ok = True
            waiting._value = None
            self.env.schedule(waiting, delay=at - self.env.now)

    def _completing(self, rank: int) -> dict[int, tuple[int, ...]]:
        """Index of each action after which a stage's gradients are final -> those stages."""
        held = (stage for stage, holder in enumerate(self.schedule.stage_to_rank) if holder == rank)
        return completing_items(self.schedule.actions[rank], held)

    def _plan(self, rank: int) -> list[tuple]:
        """Everything about each item of a rank that does not depend on time, computed once.

        Per item: the item, its duration, the remote inputs it waits for, the outputs it
        sends (key, consumer rank, its route: the rank pair's link, or with contention the
        shared links, transfer seconds, producing action), the
        reductions it starts on the DP stream, and the stages whose gradients it completes.
        """
        inp, chains = self.inp, self.schedule.topology
        stage_to_rank = self.schedule.stage_to_rank
        transfer_s, action_s, action_buckets = inp.transfer_s, inp.action_s, inp.action_buckets
        transfer_links = inp.transfer_links
        completing = self._completing(rank) if inp.overlap_grad_sync else {}
        # what an action of a (stage, kind) takes, receives and sends, whatever its microbatch
        shapes: dict[tuple[int, str], tuple] = {}

        def shape(stage: int, kind: str) -> tuple:
            source = target = None
            if kind != "W":
                # the input comes from the previous stage of the chain (F) or the next one
                # (B, I); a chain's first and last stages have no neighbour on that side
                data = "act" if kind == "F" else "grad"
                before = chains.previous(stage) if kind == "F" else chains.next(stage)
                after = chains.next(stage) if kind == "F" else chains.previous(stage)
                if before is not None and stage_to_rank[before] != rank:
                    source = data
                if after is not None and stage_to_rank[after] != rank:
                    consumer = stage_to_rank[after]
                    if transfer_links is None:  # a link of its own per rank pair
                        target = (data, after, consumer, (rank, consumer), transfer_s.get((stage, after), 0.0))
                    else:  # a flow on shared links that carries the message's latency too
                        spec = transfer_links[(stage, after)]
                        target = (data, after, consumer, spec.links, spec.latency_s + spec.busy_s)
            key = (stage, kind)
            found = shapes[key] = (source, target, action_s.get(key), action_buckets.get(key, ()))
            return found

        plan = []
        for index, item in enumerate(self.schedule.actions[rank]):
            inputs, outputs = (), ()
            for action in (item.forward, item.backward) if type(item) is Overlapped else (item,):
                stage, kind, microbatch = action
                source, target, duration, buckets = shapes.get((stage, kind)) or shape(stage, kind)
                if source is not None:
                    inputs += ((source, stage, microbatch),)
                if target is not None:
                    data, after, consumer, link, seconds = target
                    outputs += (((data, after, microbatch), consumer, link, seconds, action),)
            if type(item) is not Action:  # a pair or an unsharding action: a duration and reductions of its own
                key = duration_key(item)
                duration, buckets = action_s[key], action_buckets.get(key, ())
            elif duration is None:
                raise KeyError(f"no duration for action {item} in the engine input")
            plan.append((item, duration, inputs, outputs, buckets, completing.get(index, ())))
        return plan

    def _rank(self, rank: int):
        """The process of one rank: per action, wait for its inputs and its own sends, compute, send.

        The start of an action is the latest of three times: the previous action's end,
        its inputs' arrival and (blocking sends) the landing of the rank's own sends. The
        rank waits for the inputs first: an input usually comes after the sends have
        landed, and then one wake-up covers both.
        """
        env, arrival, sent_at = self.env, self.arrival, self.sent_at
        records, send_waits = self.timeline.actions[rank], self.timeline.send_waits
        shared, blocking, sending, dp = self.shared, self.inp.send_blocking, self.sending[rank], self.dp
        with_receive = self.inp.send_blocking_with_receive
        not_before = self.inp.not_before_s
        gathered_after, gather_waits = self.inp.gathered_after, self.timeline.gather_waits
        sends_done = 0.0  # when the rank's sends so far have landed (without contention: known when sent)
        end = 0.0
        for index, (item, duration, inputs, outputs, buckets, completes) in enumerate(self._plan(rank)):
            # inputs: each arrived already, or the rank sleeps until it lands
            start, sent = end, None
            if not_before:
                start = max(start, not_before.get((rank, index), 0.0))
            for key in inputs:
                at = arrival.pop(key, None)
                if at is None:
                    yield self._input_landing(key)
                    arrival.pop(key, None)
                    at = env.now
                if at > start:
                    start = at
                sent = sent_at[key] if sent is None else max(sent, sent_at[key])
            # own sends: a blocking send holds the rank until it has landed
            ready = end
            if blocking and (inputs or not with_receive):
                if shared is not None:
                    while sending:  # the flow's own callback lands it before this rank resumes
                        yield sending[-1].timer
                    sends_done = self.sends_landed[rank]
                if sends_done > end:
                    ready = sends_done
                    send_waits.append((rank, end, ready))
                    if ready > start:
                        start = ready
            if gathered_after:
                gathered = max(((records[earlier - 1].start_s if earlier else 0.0) + seconds
                                for earlier, seconds in gathered_after.get((rank, index), ())), default=0.0)
                if gathered > start:
                    gather_waits.append((rank, start, gathered))
                    start = gathered
            if start > env.now:
                yield env.timeout(start - env.now)
            # compute; the reductions this action produces become ready while it runs
            end = start + duration
            if buckets:
                dp.add(rank, buckets, start, end, f"{item}")
            for stage in completes:
                dp.add_stage(rank, stage, start, end)
            if duration > 0:
                yield env.timeout(duration)
            end = env.now
            records.append(ActionRecord(rank, index, item, ready, start, end, sent))
            if outputs:
                sends_done = self._send(rank, outputs, end, sends_done)
        yield from self._finish_rank(rank, end, sends_done)

    def _input_landing(self, key: tuple[str, int, int]) -> simpy.Event:
        """What a rank waiting for ``key`` sleeps on: the flow carrying it when in flight (its
        timer lands it first), else an event of its own that the transfer takes over."""
        flow = self.flow_of.get(key)
        if flow is not None:
            return flow.timer
        event = self.waiting[key] = self.env.event()
        return event

    def _send(self, rank: int, outputs: tuple, end: float, sends_done: float) -> float:
        """Send an action's outputs at ``end``; when the rank's sends so far will have landed.

        Without contention each link carries one transfer at a time, in the sender's order,
        so the landing is known now; with contention it is known when the flow lands.
        """
        for out_key, consumer, route, seconds, action in outputs:
            self.sent_at[out_key] = end
            if self.shared is not None:
                self._send_shared(rank, consumer, out_key, action, end, route, seconds)
                continue
            tx_start = max(end, self.link_free.get(route, 0.0))
            tx_end = tx_start + seconds
            self.link_free[route] = tx_end
            self.timeline.transfers.append(TransferRecord(rank, consumer, action, tx_start, tx_end))
            self._deliver(out_key, tx_end)
            if tx_end > sends_done:
                sends_done = tx_end
        return sends_done

    def _finish_rank(self, rank: int, end: float, sends_done: float):
        """After the rank's last action: its blocking sends land, then its stages' final reductions
        (queued here when gradients are not reduced during the backward) and the DP stream closes."""
        if self.inp.send_blocking:
            if self.shared is not None:
                while self.sending[rank]:
                    yield self.sending[rank][-1].timer
                sends_done = self.sends_landed[rank]
            if sends_done > end:
                self.timeline.send_waits.append((rank, end, sends_done))
                if sends_done > self.env.now:
                    yield self.env.timeout(sends_done - self.env.now)
        if not self.inp.overlap_grad_sync:
            records = self.timeline.actions[rank]
            last = records[-1].end_s if records else 0.0
            stages = sorted({a.stage for item in self.schedule.actions[rank] for a in parts(item)}, reverse=True)
            for stage in stages:
                self.dp.add_stage(rank, stage, last, last)
        self.dp.close(rank)

    def _send_shared(self, rank: int, consumer: int, key: tuple[str, int, int], action: Action, end: float,
                     links: tuple, seconds: float) -> None:
        """Start a pipeline transfer as a flow on shared links; deliver it when it lands."""
        flow = self.shared.transfer(seconds, links, partial(self._landed, rank, consumer, key, action, end))
        if flow is not None:
            self.flow_of[key] = flow
            self.sending[rank].append(flow)
            parked = self.waiting.pop(key, None)
            if parked is not None:  # the consumer wakes with the flow's timer, no event of its own
                flow.timer.callbacks += parked.callbacks
                parked.callbacks = []

    def _landed(self, rank: int, consumer: int, key: tuple[str, int, int], action: Action, end: float) -> None:
        """A pipeline transfer arrived: record it and wake its consumer (a blocked sender wakes on its timer)."""
        now = self.env.now
        self.timeline.transfers.append(TransferRecord(rank, consumer, action, end, now))
        flow = self.flow_of.pop(key, None)
        if flow is not None:
            self.sending[rank].remove(flow)
        self.sends_landed[rank] = now
        self._deliver(key, now)

    def execute(self) -> Timeline:
        for rank in range(self.schedule.num_ranks):
            self.env.process(self._rank(rank))
        with cyclic_gc_paused():
            self.env.run()
        unfinished = [r for r in range(self.schedule.num_ranks)
                      if len(self.timeline.actions[r]) != len(self.schedule.actions[r])]
        if unfinished:
            rank = unfinished[0]
            stuck = self.schedule.actions[rank][len(self.timeline.actions[rank])]
            raise RuntimeError(f"simulation stalled: rank {rank} never ran {stuck}")
        finish_step(self.inp, self.timeline, self.dp.grad_done)
        return self.timeline


def finish_step(inp: EngineInput, timeline: Timeline, grad_done: list[float]) -> None:
    """After each rank's gradients are reduced (``grad_done``): pair syncs (tied embeddings), then the
    optimizer (with ``optimizer_barrier``, on every rank once the last rank is ready; with
    ``optimizer_chain``, on each rank not before the rank before it has started its own)."""
    done = list(grad_done)
    for a, b, seconds, label in inp.pair_syncs:
        begin = max(done[a], done[b])
        for rank in (a, b):
            if seconds > 0:  # a zero-second sync only joins the two ranks (DualPipe's block copies)
                timeline.syncs.append(SyncRecord(rank, "embedding-sync", label, begin, begin + seconds))
            done[rank] = begin + seconds
    if inp.optimizer_barrier and done:
        done = [max(done)] * len(done)
    if inp.optimizer_chain:
        for rank in range(1, len(done)):
            done[rank] = max(done[rank], done[rank - 1])
    ends = []
    for rank, ready in enumerate(done):
        seconds = inp.finalize_s[rank] if inp.finalize_s else 0.0
        if seconds > 0:
            timeline.syncs.append(SyncRecord(rank, "optimizer", "optimizer step", ready, ready + seconds))
        ends.append(ready + seconds)
    timeline.rank_end_s = ends


def simulate(inp: EngineInput) -> Timeline:
    """Run one training step of ``inp.schedule`` and return its timeline."""
    return _Run(inp).execute()


def simulate_sharing(inp: EngineInput) -> tuple[Timeline, float]:
    """``simulate``, and when a link first carried two flows at once (infinity: never, or no
    shared links): until then every flow moved at the rate the cost model priced."""
    run = _Run(inp)
    timeline = run.execute()
    return timeline, run.shared.first_shared_s if run.shared is not None else float("inf")


def blocking_mode(inp: EngineInput) -> int:
    """``inp``'s blocking sends as the compiled loops take them: 0 none, 1 before every action,
    2 before an action that receives an input (``EngineInput.send_blocking_with_receive``)."""
    if not inp.send_blocking:
        return 0
    return 2 if inp.send_blocking_with_receive else 1
