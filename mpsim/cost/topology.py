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

One group stands for all its copies (the symmetry collapse: TP group 0 for every TP group
of the job). Copies need not sit alike: with 72-GPU NVLink domains a TP group of 16
straddles two domains every so often, and with scalable units of 20 nodes a DP group of
8 nodes sometimes spans two leaf groups. A placement built with the job's size knows its
copies (:func:`copy_shapes`), and the cost layer prices the slowest of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

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
    # the job's ranks (0: the group stands only for itself) and the rank dimensions, as
    # (stride, extent), that the group runs along: its copies are its ranks shifted by every
    # rank of the job whose coordinate along each of them is 0
    world: int = field(default=0, repr=False)
    along: tuple[tuple[int, int], ...] = field(default=(), repr=False)

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


# placements by their exact inputs: the cost layer places the same groups for every layout of a
# plan (and the optimizer's gradient checks once per rank); a placement is frozen, so sharing
# one object is the same as building it again
_PLACED: dict[tuple, GroupPlacement] = {}
PLACED_ENTRIES = 8192


def place_ranks(ranks: list[int], devices_per_node: int, world: int = 0,
                along: tuple[tuple[int, int], ...] | None = None) -> GroupPlacement:
    """Placement of an explicit list of global ranks.

    With ``world`` (the job's ranks) the placement also stands for the group's copies in the
    job: the groups along the same rank dimensions (``along``; by default read off the ranks,
    which must then contain rank 0 and form a lattice, as every group of a layout does).
    """
    if along is not None and not isinstance(along, tuple):
        return _place_ranks(list(ranks), devices_per_node, world, along)
    key = (tuple(ranks), devices_per_node, world, along)
    placed = _PLACED.get(key)
    if placed is None:
        placed = _place_ranks(list(ranks), devices_per_node, world, along)
        if len(_PLACED) >= PLACED_ENTRIES:
            _PLACED.clear()
        _PLACED[key] = placed
    return placed


def _place_ranks(ranks: list[int], devices_per_node: int, world: int,
                 along: tuple[tuple[int, int], ...] | None) -> GroupPlacement:
    counts = Counter(rank // devices_per_node for rank in ranks)
    if world and along is None:
        along = lattice_dims(ranks)
        if along and world % (along[-1][0] * along[-1][1]):
            along = ()  # the copies would not tile the job
    if not world or not along:
        world, along = 0, ()
    return GroupPlacement(len(ranks), len(counts), max(counts.values()), tuple(ranks), devices_per_node, world,
                          along)


def lattice_dims(ranks: list[int]) -> tuple[tuple[int, int], ...]:
    """(stride, extent) of each rank dimension a group containing rank 0 runs along; () if it is no lattice.

    A group of a layout is ``{sum_i c_i s_i : 0 <= c_i < n_i}``: the smallest member not yet
    reached is the next stride, and its extent how many steps of it stay in the group.
    """
    members = set(ranks)
    if 0 not in members or len(members) != len(ranks):
        return ()
    reached = [0]
    dims: list[tuple[int, int]] = []
    while len(reached) < len(members):
        stride = min(members.difference(reached))
        extent = 1
        while all(rank + extent * stride in members for rank in reached):
            extent += 1
        if dims and stride % (dims[-1][0] * dims[-1][1]):
            return ()  # not a mixed-radix dimension of the rank numbering
        dims.append((stride, extent))
        reached = [rank + step * stride for step in range(extent) for rank in reached]
    return tuple(dims) if set(reached) == members else ()


def copy_offsets(place: GroupPlacement) -> np.ndarray:
    """Shifts from the group to each of its copies (0, the group itself, first)."""
    offsets = np.arange(place.world)
    keep = np.ones(place.world, dtype=bool)
    for stride, extent in place.along:
        keep &= (offsets // stride) % extent == 0
    return offsets[keep]


@lru_cache(maxsize=1024)
def copy_shapes(place: GroupPlacement, devices_per_node: int, level_nodes: tuple[int | None, ...] = ()
                ) -> tuple[GroupPlacement, ...]:
    """One copy of the group for each distinct way its copies sit on nodes and fat-tree levels.

    Two copies sit alike when their members are spread over nodes the same way (relative to
    their first node) and they climb the same number of levels (``level_nodes`` as in
    :func:`levels_climbed`). The group itself comes first; without copies it is all there is.
    """
    if not place.world:
        return (place,)
    base = np.asarray(place.member_ranks(devices_per_node))
    ranks = copy_offsets(place)[:, None] + base[None, :]
    if ranks.size == 0 or ranks.max() >= place.world:
        return (place,)  # the copies do not fit the job: price the group alone
    nodes = np.sort(ranks // devices_per_node, axis=1)
    climbed = np.full(len(nodes), len(level_nodes))
    for index in reversed(range(len(level_nodes))):
        block = level_nodes[index]
        same = np.ones(len(nodes), dtype=bool) if block is None else nodes[:, 0] // block == nodes[:, -1] // block
        climbed = np.where(same, index, climbed)
    signature = np.concatenate([nodes - nodes[:, :1], climbed[:, None]], axis=1)
    _, first = np.unique(signature, axis=0, return_index=True)
    shapes = [place_ranks([int(rank) for rank in ranks[row]], devices_per_node) for row in sorted(first)]
    return tuple([place] + shapes[1:]) if sorted(first)[0] == 0 else tuple(shapes)


def pipeline_pair(layout: Layout, rank: int, other: int) -> GroupPlacement:
    """Pipeline ranks ``rank`` and ``other`` (of TP rank 0, DP rank 0), standing for the same pair
    in every replica: a transfer between two stages happens in each of them at once."""
    stride = layout.stride("pp")
    return place_ranks([rank * stride, other * stride], layout.devices_per_node, layout.devices,
                       ((stride, layout.pp),))


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


# groups that must stay inside one scale-up domain to run at its speed, and their names in warnings
FAST_GROUPS = {"tp": "TP", "etp": "expert TP", "ep": "EP"}


def placement_warnings(devices: int, devices_per_node: int, system_name: str,
                       placements: dict[str, GroupPlacement]) -> list[str]:
    """What a job's placement on scale-up domains (nodes) does that the user may not mean.

    * The job's devices are not a whole number of domains: the last one is partly used
      (a rack-scale domain such as a 72-GPU NVL72 is given out whole). A job on part of one
      server of 8 or fewer devices is ordinary and says nothing.
    * A TP or EP group that fits in one domain has copies that straddle two (a TP group of
      16 on 72-GPU domains): those copies run over the network, and every group is priced
      as its slowest copy.
    """
    found = []
    spare = devices % devices_per_node
    if spare and (devices > devices_per_node or devices_per_node > 8):
        found.append(f"{devices} devices are not a whole number of {system_name}'s {devices_per_node}-device "
                     f"scale-up domains: one domain has only {spare} of its {devices_per_node} devices in the job")
    for name, label in FAST_GROUPS.items():
        place = placements.get(name)
        if place is None or place.size <= 1:
            continue
        needed = -(-place.size // devices_per_node)
        widest = max(copy.nodes for copy in copy_shapes(place, devices_per_node))
        if widest > needed:
            members = place.member_ranks(devices_per_node)
            gap = min((b - a for a, b in zip(members, members[1:])), default=1)
            if gap > 1 and devices_per_node % place.size == 0:
                # the group would fit, but its members sit apart: other groups' ranks lie between them
                cause = (f"their members are {gap} devices apart (the ranks of inner groups lie between them), so "
                         f"each group spans {place.size * gap} devices and its members")
                remedy = f"keeping {label} size x {gap} within {devices_per_node} avoids it"
            else:
                cause = f"some span {widest} domains and their members"
                remedy = f"a group size that divides {devices_per_node} avoids it"
            found.append(f"{label} groups of {place.size} do not fit the {devices_per_node}-device scale-up domains "
                         f"evenly: {cause} reach each other over the network, which sets the time of every "
                         f"{label} collective ({remedy})")
    return found
