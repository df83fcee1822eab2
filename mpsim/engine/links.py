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

from dataclasses import dataclass, field
from typing import Callable

import simpy


@dataclass(eq=False)
class Flow:
    """One transfer in flight."""

    remaining_s: float  # seconds left if it had its links to itself
    links: tuple
    on_done: Callable[[], None]
    rate: float = 0.0
    updated_s: float = 0.0
    version: int = 0


@dataclass
class SharedLinks:
    """All shared links of one simulation."""

    env: simpy.Environment
    flows_on: dict = field(default_factory=dict)  # link -> set of active flows

    def transfer(self, busy_s: float, links: tuple, on_done: Callable[[], None]) -> None:
        """Start a flow now; ``on_done()`` is called (at that simulated time) when it has moved all its data."""
        if busy_s <= 0:
            on_done()
            return
        if not links:  # nothing shared: it just takes its time
            self.env.timeout(busy_s).callbacks.append(lambda _: on_done())
            return
        flow = Flow(busy_s, links, on_done, updated_s=self.env.now)
        neighbours = self._neighbours(flow)
        for link in links:
            self.flows_on.setdefault(link, set()).add(flow)
        for other in neighbours:
            self._update(other)
        self._update(flow)

    def wait(self, busy_s: float, links: tuple) -> simpy.Event:
        """``transfer`` as an event to yield on."""
        done = self.env.event()
        self.transfer(busy_s, links, done.succeed)
        return done

    def _neighbours(self, flow: Flow) -> set[Flow]:
        found: set[Flow] = set()
        for link in flow.links:
            on_link = self.flows_on.get(link)
            if on_link:
                found.update(on_link)
        found.discard(flow)
        return found

    def _update(self, flow: Flow) -> None:
        """Advance ``flow`` to now at its old rate, take its new rate, reschedule its finish."""
        now = self.env.now
        flow.remaining_s -= (now - flow.updated_s) * flow.rate
        flow.updated_s = now
        flow.rate = 1.0 / max(len(self.flows_on[link]) for link in flow.links)
        flow.version += 1
        version = flow.version
        delay = max(0.0, flow.remaining_s) / flow.rate
        self.env.timeout(delay).callbacks.append(lambda _: self._finish(flow, version))

    def _finish(self, flow: Flow, version: int) -> None:
        if version != flow.version:
            return  # its rate changed since this timer was set
        for link in flow.links:
            self.flows_on[link].discard(flow)
        flow.on_done()
        for other in self._neighbours(flow):
            self._update(other)
