"""Which links a process group spans, from the rank order and the node size.

Ranks are numbered with the plan's order, innermost first (``tp-dp-pp``: TP neighbours
are consecutive ranks, so a TP group of 8 fills one DGX node). A group along one
dimension is the ranks ``base + i * stride``; global rank ``r`` sits on node
``r // devices_per_node``, and the nodes are numbered in the order the job's allocation
lays them out on the network (consecutive nodes share a leaf switch first). Inside a
TPU slice, chip ``r % chips`` sits at torus coordinates with the first axis fastest.

A group's collective runs at the pace of the slowest links it spans: the scale-up fabric
when it stays in a node, the network when it leaves one, and the uplinks of every fat-tree
level it has to climb.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mpsim.specs.layout import Layout


@dataclass(frozen=True)
class GroupPlacement:
    """How a group of ``size`` ranks sits on nodes.

    ``ranks`` (global ranks of the members) and ``devices_per_node`` are known when the
    placement was built from ranks; a placement written by hand as
    ``GroupPlacement(size, nodes, per_node)`` stands for ``per_node`` consecutive devices
    on each of ``nodes`` consecutive nodes.
    """

    size: int
    nodes: int  # distinct nodes the group touches
    per_node: int  # most members on one node
    ranks: tuple[int, ...] = field(default=(), repr=False)
    devices_per_node: int = 0

    def member_ranks(self, devices_per_node: int) -> tuple[int, ...]:
        """Global ranks of the members (a contiguous block when the placement has none)."""
        if self.ranks:
            return self.ranks
        block = [node * devices_per_node + i for node in range(self.nodes) for i in range(self.per_node)]
        return tuple(block[: self.size])

    def node_ids(self, devices_per_node: int) -> list[int]:
        """Sorted distinct nodes the group touches."""
        per_node = self.devices_per_node or devices_per_node
        return sorted({rank // per_node for rank in self.member_ranks(per_node)})


def place_ranks(ranks: list[int], devices_per_node: int) -> GroupPlacement:
    """Placement of an explicit list of global ranks."""
    counts = Counter(rank // devices_per_node for rank in ranks)
    return GroupPlacement(len(ranks), len(counts), max(counts.values()), tuple(ranks), devices_per_node)


def pipeline_neighbours_share_node(layout: Layout, rank: int, other: int) -> bool:
    """Whether pipeline ranks ``rank`` and ``other`` (of TP rank 0, DP rank 0) share a node."""
    stride = layout.stride("pp")
    return (rank * stride) // layout.devices_per_node == (other * stride) // layout.devices_per_node


def levels_climbed(node_ids: list[int], level_nodes: list[int | None]) -> int:
    """How many fat-tree levels above the leaf a group of nodes has to climb.

    ``level_nodes[i]`` is how many nodes one switch group of level ``i`` joins (``None``:
    all). A group inside one leaf group climbs 0 levels; one that spans two leaf groups
    but one spine group climbs 1 (it crosses the leaf uplinks), and so on.
    """
    for index, block in enumerate(level_nodes):
        if block is None or len({node // block for node in node_ids}) == 1:
            return index
    return len(level_nodes)


def torus_coordinates(chip: int, dims: list[int]) -> tuple[int, ...]:
    """Coordinates of chip ``chip`` of a slice, first axis fastest."""
    coords = []
    for size in dims:
        coords.append(chip % size)
        chip //= size
    return tuple(coords)


def torus_extent(chips: list[int], dims: list[int]) -> list[int]:
    """Distinct coordinates a set of chips takes along each torus axis."""
    points = [torus_coordinates(chip, dims) for chip in chips]
    return [len({p[axis] for p in points}) for axis in range(len(dims))]
