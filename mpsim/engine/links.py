"""Links that concurrent transfers share: processor sharing in the SimPy engine.

Each transfer (a pipeline send, a DP gradient bucket) is a *flow* over one or more
links (a rank's NIC egress and the peer's ingress, say). A flow's size is the time it
would take alone, so an uncontended flow takes exactly what the cost model priced.
While several flows are active on a link they share it equally; a flow over several
links moves at the rate of its most shared link. When a flow starts or finishes, only
the flows on the same links change rate; each of those has its finishing time
recomputed (a flow alone on its links is scheduled once and never touched again).

Two flows of sizes a and b that start together on one link therefore finish after
a + b: the sum of their bytes over the link bandwidth.
"""

from __future__ import annotations

from typing import Callable

import simpy


class Flow:
    """One transfer in flight."""

    __slots__ = ("remaining_s", "links", "on_done", "rate", "updated_s", "timer", "owner", "progress")

    def __init__(self, remaining_s: float, links: tuple, on_done: Callable[[], None], now: float,
                 owner: "SharedLinks", track: bool = False):
        self.remaining_s = remaining_s  # seconds left if it had its links to itself
        self.links = links
        self.on_done = on_done
        self.rate = 1.0  # the share of its most shared link
        self.updated_s = now
        self.owner = owner
        # with ``track``: (time, seconds left) at its start and at every change of rate, so
        # that the moment it had moved any part of its data can be worked out (``passed_at``)
        self.progress: list[tuple[float, float]] | None = [(now, remaining_s)] if track else None
        # the timeout that ends the flow at its current rate; a process may yield it to wake
        # when the flow lands (after ``on_done``, whose callback comes first) or is rescheduled
        self.timer: simpy.Event | None = None

    def __call__(self, event: simpy.Event) -> None:
        """A timer of this flow fired: it has landed unless its rate changed since that timer was set."""
        if event is self.timer:
            self.owner._finish(self)

    def passed_at(self, done_s: list[float], end_s: float) -> list[float]:
        """When a tracked flow that landed at ``end_s`` had moved each amount of ``done_s``.

        Amounts ascend, in seconds the flow would take alone; between two changes of rate
        its progress is linear, so each moment is an interpolation.
        """
        points = self.progress + [(end_s, 0.0)]
        total = points[0][1]
        times, segment = [], 0
        for done in done_s:
            left = total - done
            if left <= 0:
                times.append(end_s)
                continue
            while points[segment + 1][1] > left:  # the segment in which the flow got down to ``left``
                segment += 1
            (t0, left0), (t1, left1) = points[segment], points[segment + 1]
            # a part too small to change the float total is passed where the segment starts
            # (the share of the segment first: a product of two tiny spans could underflow to 0)
            times.append(t0 if left >= left0 else t0 + (t1 - t0) * ((left0 - left) / (left0 - left1)))
        return times


class SharedLinks:
    """All shared links of one simulation."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        # link -> its active flows, in the order they started: a dict, not a set, so that
        # neighbours are updated (and their timers scheduled) in the same order every run
        self.flows_on: dict = {}
        # when a flow first started on a link that was already carrying one: until then every
        # flow has moved alone, at the rate the cost model priced (``excise.py`` reads it)
        self.first_shared_s = float("inf")

    def transfer(self, busy_s: float, links: tuple, on_done: Callable[[], None], track: bool = False) -> Flow | None:
        """Start a flow now; ``on_done()`` is called (at that simulated time) when it has moved all its data.

        Returns the flow (None when it took no time and is already done). ``track`` keeps
        its progress for ``Flow.passed_at``.
        """
        if busy_s <= 0:
            on_done()
            return None
        env = self.env
        flow = Flow(busy_s, links, on_done, env.now, self, track)
        if not links:  # nothing shared: it just takes its time
            flow.timer = env.timeout(busy_s)
            flow.timer.callbacks.append(lambda _: on_done())
            return flow
        flows_on = self.flows_on
        neighbours = None
        for link in links:
            on_link = flows_on.get(link)
            if on_link is None:
                flows_on[link] = {flow: None}
            else:
                if on_link:
                    if neighbours is None:
                        neighbours = dict(on_link)
                    else:
                        neighbours.update(on_link)
                on_link[flow] = None
        if neighbours is None:  # alone on its links (the common case): one timer, rate 1
            timer = flow.timer = env.timeout(busy_s)
            timer.callbacks.append(flow)
            return flow
        if env.now < self.first_shared_s:
            self.first_shared_s = env.now
        for other in neighbours:
            self._update(other)
        self._update(flow)
        return flow

    def wait(self, busy_s: float, links: tuple) -> simpy.Event:
        """``transfer`` as an event to yield on."""
        done = self.env.event()
        self.transfer(busy_s, links, done.succeed)
        return done

    def _update(self, flow: Flow) -> None:
        """Advance ``flow`` to now at its old rate, take its new rate, reschedule its finish."""
        now = self.env.now
        flow.remaining_s -= (now - flow.updated_s) * flow.rate
        flow.updated_s = now
        if flow.progress is not None:
            flow.progress.append((now, flow.remaining_s))
        sharing = 1
        flows_on = self.flows_on
        for link in flow.links:
            count = len(flows_on[link])
            if count > sharing:
                sharing = count
        flow.rate = 1.0 / sharing
        remaining = flow.remaining_s if flow.remaining_s > 0 else 0.0
        stale, flow.timer = flow.timer, self.env.timeout(remaining * sharing)
        flow.timer.callbacks.append(flow)  # the stale timer still fires, finds itself replaced, does nothing
        if stale is not None and len(stale.callbacks) > 1:
            # processes waiting for the landing move to the new timer: an earlier landing must wake them
            flow.timer.callbacks += stale.callbacks[1:]
            del stale.callbacks[1:]

    def _finish(self, flow: Flow) -> None:
        neighbours = None
        flows_on = self.flows_on
        for link in flow.links:
            on_link = flows_on[link]
            del on_link[flow]
            if on_link:
                if neighbours is None:
                    neighbours = dict(on_link)
                else:
                    neighbours.update(on_link)
        flow.on_done()
        if neighbours:
            for other in neighbours:
                self._update(other)
