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

    __slots__ = ("remaining_s", "links", "on_done", "rate", "updated_s", "timer", "owner")

    def __init__(self, remaining_s: float, links: tuple, on_done: Callable[[], None], now: float,
                 owner: "SharedLinks"):
        self.remaining_s = remaining_s  # seconds left if it had its links to itself
        self.links = links
        self.on_done = on_done
        self.rate = 0.0
        self.updated_s = now
        self.owner = owner
        # the timeout that ends the flow at its current rate; a process may yield it to wake
        # when the flow lands (after ``on_done``, whose callback comes first) or is rescheduled
        self.timer: simpy.Event | None = None

    def __call__(self, event: simpy.Event) -> None:
        """A timer of this flow fired: it has landed unless its rate changed since that timer was set."""
        if event is self.timer:
            self.owner._finish(self)


class SharedLinks:
    """All shared links of one simulation."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.flows_on: dict = {}  # link -> set of active flows

    def transfer(self, busy_s: float, links: tuple, on_done: Callable[[], None]) -> Flow | None:
        """Start a flow now; ``on_done()`` is called (at that simulated time) when it has moved all its data.

        Returns the flow (None when it took no time and is already done).
        """
        if busy_s <= 0:
            on_done()
            return None
        env = self.env
        flow = Flow(busy_s, links, on_done, env.now, self)
        if not links:  # nothing shared: it just takes its time
            flow.timer = env.timeout(busy_s)
            flow.timer.callbacks.append(lambda _: on_done())
            return flow
        flows_on = self.flows_on
        neighbours = None
        for link in links:
            on_link = flows_on.get(link)
            if on_link is None:
                flows_on[link] = {flow}
            else:
                if on_link:
                    if neighbours is None:
                        neighbours = set(on_link)
                    else:
                        neighbours.update(on_link)
                on_link.add(flow)
        if neighbours is None:  # alone on its links (the common case): one timer, rate 1
            flow.rate = 1.0
            flow.timer = env.timeout(busy_s)
            flow.timer.callbacks.append(flow)
            return flow
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
        sharing = 1
        flows_on = self.flows_on
        for link in flow.links:
            count = len(flows_on[link])
            if count > sharing:
                sharing = count
        flow.rate = 1.0 / sharing
        remaining = flow.remaining_s if flow.remaining_s > 0 else 0.0
        flow.timer = self.env.timeout(remaining * sharing)
        flow.timer.callbacks.append(flow)  # an earlier timer of the flow, now stale, finds itself replaced

    def _finish(self, flow: Flow) -> None:
        neighbours = None
        flows_on = self.flows_on
        for link in flow.links:
            on_link = flows_on[link]
            on_link.discard(flow)
            if on_link:
                if neighbours is None:
                    neighbours = set(on_link)
                else:
                    neighbours.update(on_link)
        flow.on_done()
        if neighbours:
            for other in neighbours:
                self._update(other)
