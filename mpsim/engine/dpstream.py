"""Each rank's data-parallel stream: gradient reductions, one at a time, in order.

A backward pass produces its gradients bucket by bucket, and each bucket's reduction
goes on the rank's DP stream as soon as it is ready, overlapping the compute that
follows. The stream sends one bucket at a time: a bucket waits for the one before it.
When the rank has run its last action and its stream has drained, its gradients are
synchronized (``grad_done``) and the optimizer step may follow.

Without link contention the stream is plain arithmetic: each bucket starts at the later
of its ready time and the previous bucket's end. With it, buckets are flows on the
links they share with pipeline transfers (``links.py``); the stream is then a queue
driven by the flows' callbacks, not a process, and buckets already ready on the same
links go out as one flow whose progress tells when each of them ended.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Mapping, NamedTuple

from mpsim.engine.links import Flow, SharedLinks
from mpsim.engine.timeline import SyncRecord, Timeline


class GradBucket(NamedTuple):
    """A DP gradient bucket: ready after ``ready_fraction`` of the stage's last backward.

    ``links`` names the links its traffic shares with other transfers (empty: none).
    """

    ready_fraction: float
    duration_s: float
    label: str = "grad bucket"
    links: tuple = ()


class DPStreams:
    """The DP streams of all ranks of one simulation."""

    def __init__(self, timeline: Timeline, num_ranks: int, stage_buckets: Mapping[int, tuple[GradBucket, ...]],
                 shared: SharedLinks | None = None):
        self.timeline, self.stage_buckets, self.shared = timeline, stage_buckets, shared
        self.env = shared.env if shared is not None else None
        self.grad_done = [0.0] * num_ranks  # when each rank's gradients are synchronized
        self.free_s = [0.0] * num_ranks  # without contention: when each stream is next free
        # with contention: queued (ready time, bucket, label), a flow in flight or a wait for
        # the next bucket to become ready, the rank done with its actions, the flow in flight
        self.queues: list[deque] = [deque() for _ in range(num_ranks)]
        self.busy = [False] * num_ranks
        self.closed = [False] * num_ranks
        self.flow: list[Flow | None] = [None] * num_ranks

    def add(self, rank: int, buckets: tuple[GradBucket, ...], start: float, end: float, label: str) -> None:
        """Queue the reductions an action running ``start``..``end`` produces, each ready at its fraction."""
        if not buckets:
            return
        if self.shared is not None:
            self.queues[rank].extend((start + bucket.ready_fraction * (end - start), bucket, label)
                                     for bucket in buckets)
            if not self.busy[rank]:
                self._next(rank)
            return
        free = self.free_s[rank]
        for bucket in buckets:
            begin = max(start + bucket.ready_fraction * (end - start), free)
            free = begin + bucket.duration_s
            if free > begin:  # as with contention: a bucket too short to move the clock leaves no record
                self.timeline.syncs.append(SyncRecord(rank, "dp-comm", f"{label} {bucket.label}", begin, free))
        self.free_s[rank] = free

    def add_stage(self, rank: int, stage: int, start: float, end: float) -> None:
        """A stage's gradients are final after the action running ``start``..``end``: queue its reductions."""
        self.add(rank, self.stage_buckets.get(stage, ()), start, end, f"stage {stage}")

    def close(self, rank: int, compute_end_s: float | None = None) -> None:
        """The rank has run its last action (ending at ``compute_end_s``; None: its last record's
        end): its gradients are done when its stream drains."""
        if self.shared is None:
            end = self._compute_end(rank) if compute_end_s is None else compute_end_s
            self.grad_done[rank] = max(self.free_s[rank], end)
            return
        self.closed[rank] = True
        if not self.busy[rank]:
            self._next(rank)

    def _next(self, rank: int) -> None:
        """Start the rank's next buckets as one flow once the first is ready.

        A bucket costs its share of a flow's timer (plus one per change of the flow's
        rate), and a queue that must wait for its next bucket one timer more.
        """
        queue, now = self.queues[rank], self.env.now
        while queue:
            ready, bucket, label = queue[0]
            if ready > now:
                self.busy[rank] = True
                self.env.timeout(ready - now).callbacks.append(lambda _: self._next(rank))
                return
            queue.popleft()
            if bucket.duration_s <= 0:
                continue
            # the buckets behind it that are ready too: sent one at a time, each would move
            # at the rate the whole flow gets, so one flow carries them all
            batch, done_s = [(bucket, label)], [bucket.duration_s]
            while queue and queue[0][0] <= now and queue[0][1].links == bucket.links:
                _, more, more_label = queue.popleft()
                if more.duration_s > 0:
                    batch.append((more, more_label))
                    done_s.append(done_s[-1] + more.duration_s)
            self.busy[rank] = True
            self.flow[rank] = self.shared.transfer(done_s[-1], bucket.links,
                                                   partial(self._landed, rank, batch, done_s, now),
                                                   track=len(batch) > 1)
            return
        self.busy[rank] = False
        if self.closed[rank]:
            self.grad_done[rank] = max(now, self._compute_end(rank))

    def _compute_end(self, rank: int) -> float:
        records = self.timeline.actions[rank]
        return records[-1].end_s if records else 0.0

    def _landed(self, rank: int, batch: list[tuple[GradBucket, str]], done_s: list[float], begin: float) -> None:
        """A flow of buckets landed: record when each one ended, then start what is queued."""
        now = self.env.now
        ends = self.flow[rank].passed_at(done_s, now) if len(batch) > 1 else [now]
        for (bucket, label), end in zip(batch, ends):
            if end > begin:
                self.timeline.syncs.append(SyncRecord(rank, "dp-comm", f"{label} {bucket.label}", begin, end))
            begin = end
        self._next(rank)
