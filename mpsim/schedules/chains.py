"""How a schedule's global stages form pipelines ("chains").

Most schedules run one pipeline: stage ``s`` feeds stage ``s + 1`` and the last stage
computes the loss. The bidirectional DualPipe (DeepSeek-V3, Sec. 3.2.1) runs two: the
same ``p`` layer blocks, once on ranks ``0..p-1`` and once on ranks ``p-1..0``. Its
stages are numbered chain after chain (``0..p-1`` then ``p..2p-1``), and a chain is
described by its length alone. Within a chain the ``k``-th stage computes layer block
``k``, so stage ``p + k`` holds a second copy of block ``k``.

Microbatches are dealt to the chains in order and in equal shares: with ``m``
microbatches and two chains, chain 0 carries ``0..m/2-1`` and chain 1 ``m/2..m-1``;
every microbatch passes through one chain once.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageChains:
    """Chains of consecutive global stages; ``lengths`` empty means one chain of all stages."""

    num_stages: int
    lengths: tuple[int, ...] = ()
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lengths = self.lengths or (self.num_stages,)
        if any(n <= 0 for n in lengths) or sum(lengths) != self.num_stages:
            raise ValueError(f"chains: lengths {list(lengths)} must be positive and add up to the "
                             f"{self.num_stages} stages")
        starts, first = [], 0
        for n in lengths:
            starts.append(first)
            first += n
        object.__setattr__(self, "lengths", tuple(lengths))
        object.__setattr__(self, "starts", tuple(starts))

    @property
    def count(self) -> int:
        """Number of chains (pipelines)."""
        return len(self.lengths)

    def chain(self, stage: int) -> int:
        """Index of the chain holding ``stage``."""
        return bisect_right(self.starts, stage) - 1

    def first(self, stage: int) -> int:
        """First stage of ``stage``'s chain (it holds the embedding)."""
        return self.starts[self.chain(stage)]

    def last(self, stage: int) -> int:
        """Last stage of ``stage``'s chain (it computes the loss)."""
        index = self.chain(stage)
        return self.starts[index] + self.lengths[index] - 1

    def previous(self, stage: int) -> int | None:
        """The stage whose activation ``stage``'s forward consumes (None at a chain's start)."""
        return stage - 1 if stage > self.first(stage) else None

    def next(self, stage: int) -> int | None:
        """The stage whose input gradient ``stage``'s backward consumes (None at a chain's end)."""
        return stage + 1 if stage < self.last(stage) else None

    def block(self, stage: int) -> int:
        """The layer block ``stage`` computes: its position in its chain."""
        return stage - self.first(stage)

    def microbatches(self, stage: int, num_microbatches: int) -> range:
        """Microbatches that pass through ``stage`` (its chain's equal share, in order)."""
        share = num_microbatches // self.count
        index = self.chain(stage)
        return range(index * share, (index + 1) * share)
