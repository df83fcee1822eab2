"""What the engine records: every action, transfer and synchronization with its times.

The timeline is plain data. The results layer turns it into metrics, traces and plots
without knowing how it was produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from mpsim.schedules.actions import Action, Item


# relative to a step's times: a difference of two times below this is rounding, not a wait (two
# sums of the same durations taken in another order, or at another magnitude, differ by that)
ROUNDING = 1e-12


class ActionRecord(NamedTuple):
    """One compute action on one rank.

    ``ready_s`` is when the rank could have started it (previous action and its sends
    done); ``start_s - ready_s`` is time spent waiting for the input. ``input_sent_s`` is
    when the producer of that input finished (None for an action with no remote input).
    """

    rank: int
    index: int
    action: Item  # an Action, or an Overlapped forward+backward pair
    ready_s: float
    start_s: float
    end_s: float
    input_sent_s: float | None = None


class TransferRecord(NamedTuple):
    """A point-to-point transfer of an activation (F) or gradient (B/I) between ranks."""

    src_rank: int
    dst_rank: int
    action: Action  # the producing action
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SyncRecord:
    """A gradient synchronization interval on a rank's data-parallel stream, or a finalize step."""

    rank: int
    kind: str  # "dp-comm", "embedding-sync", "optimizer"
    label: str
    start_s: float
    end_s: float


@dataclass
class Timeline:
    """Everything one simulated step did."""

    num_ranks: int
    actions: list[list[ActionRecord]] = field(default_factory=list)
    transfers: list[TransferRecord] = field(default_factory=list)
    syncs: list[SyncRecord] = field(default_factory=list)
    send_waits: list[tuple[int, float, float]] = field(default_factory=list)  # (rank, start, end) blocked on sends
    # (rank, start, end) an item waited for its chunk's parameters, which the pipeline runtime
    # gathers as an earlier item starts (EngineInput.gathered_after)
    gather_waits: list[tuple[int, float, float]] = field(default_factory=list)
    rank_end_s: list[float] = field(default_factory=list)
    # steps that overlap their neighbours (training.optimizer_post_validation): the time from one
    # step to the next in a long run, where the records are of one step alone (engine/consecutive.py)
    steady_period_s: float | None = None
    # per-rank views of ``syncs`` and ``send_waits``, built when first asked for (see ``_by_rank``)
    _views: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def syncs_of(self, rank: int) -> list[SyncRecord]:
        """The syncs of ``rank``, in the order they were recorded."""
        return self._by_rank("syncs", self.syncs, lambda sync: sync.rank).get(rank, [])

    def send_waits_of(self, rank: int) -> list[tuple[float, float]]:
        """(start, end) of each wait of ``rank`` for its own sends, in time order."""
        return self._by_rank("send_waits", self.send_waits, lambda wait: wait[0], lambda wait: wait[1:],
                             sort=True).get(rank, [])

    def gather_waits_of(self, rank: int) -> list[tuple[float, float]]:
        """(start, end) of each wait of ``rank`` for a chunk's gathered parameters, in time order."""
        return self._by_rank("gather_waits", self.gather_waits, lambda wait: wait[0], lambda wait: wait[1:],
                             sort=True).get(rank, [])

    def _by_rank(self, name: str, items: list, rank_of, value=lambda item: item, sort: bool = False) -> dict:
        """``items`` grouped by rank in one pass, so that asking for every rank is linear, not
        quadratic; rebuilt if the list has grown since (a timeline is final once simulated)."""
        view = self._views.get(name)
        if view is None or view[0] != len(items):
            groups: dict[int, list] = {}
            for item in items:
                groups.setdefault(rank_of(item), []).append(value(item))
            if sort:
                for group in groups.values():
                    group.sort()
            view = self._views[name] = (len(items), groups)
        return view[1]

    @property
    def span_s(self) -> float:
        """From the step's start to the last rank's end: the extent of the records."""
        return max(self.rank_end_s) if self.rank_end_s else 0.0

    @property
    def step_time_s(self) -> float:
        """Seconds per step: the step's span, or the period of a run whose steps overlap."""
        return self.span_s if self.steady_period_s is None else self.steady_period_s

    @property
    def pipeline_end_s(self) -> float:
        """When the last compute action on any rank ended."""
        return max((records[-1].end_s for records in self.actions if records), default=0.0)
