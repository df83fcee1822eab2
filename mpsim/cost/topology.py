"""Which links a process group spans, from the rank order and the node size.

Ranks are numbered with the plan's order, innermost first (``tp-dp-pp``: TP neighbours
are consecutive ranks, so a TP group of 8 fills one DGX node). A group along one
dimension is the ranks ``base + i * stride``; the nodes they land on decide whether its
collectives run over the scale-up fabric, the network, or both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mpsim.specs.layout import Layout


@dataclass(frozen=True)
class GroupPlacement:
    """How a group of ``size`` ranks sits on nodes."""

    size: int
    nodes: int  # distinct nodes the group touches
    per_node: int  # most members on one node

    @property
    def intra_node(self) -> bool:
        return self.nodes == 1


def place_ranks(ranks: list[int], devices_per_node: int) -> GroupPlacement:
    """Placement of an explicit list of global ranks."""
    counts = Counter(rank // devices_per_node for rank in ranks)
    return GroupPlacement(len(ranks), len(counts), max(counts.values()))


def group_placement(layout: Layout, dim: str) -> GroupPlacement:
    """Placement of the group along ``dim`` that contains rank 0."""
    size = getattr(layout, dim)
    stride = layout.stride(dim)
    return place_ranks([i * stride for i in range(size)], layout.devices_per_node)


def pipeline_neighbours_share_node(layout: Layout, rank: int, other: int) -> bool:
    """Whether pipeline ranks ``rank`` and ``other`` (of TP rank 0, DP rank 0) share a node."""
    stride = layout.stride("pp")
    return (rank * stride) // layout.devices_per_node == (other * stride) // layout.devices_per_node
