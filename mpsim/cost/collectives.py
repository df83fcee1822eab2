"""Seconds for a collective on a group's links, with the algorithm a real library would pick.

This module decides what a group spans and hands it to the right model:

* on GPU nodes and fat trees, NCCL's algorithms (``nccl.py``: ring, double binary tree,
  hierarchical, NVLS in-switch reduction, NVLS-tree, pairwise all-to-all), and the
  fastest one for this group and size is taken, as NCCL's tuner does;
* inside a TPU slice, axis-by-axis collectives on the torus (``torus.py``); across
  slices, the data-center network joins the slices hierarchically.

What a group spans follows the plan's rank order (``topology.py``): how many nodes it
touches, how many members share a node (the scale-up links they use), which fat-tree
levels it climbs (the oversubscription it feels), and on a torus which axes it covers.
Every algorithm runs at the pace of the slowest link it uses. A group of a layout stands
for all its copies in the job (they run at once and the step waits for the slowest), so
it is priced as its slowest copy; a group written as a list of ranks (``mpsim
collective``) is priced where it sits. Collectives, ``mpsim collective`` and pipeline
transfers all reach the network through :func:`network_link`, the one place the fat
tree's oversubscription is applied.

Message sizes are nccl-tests sizes: the buffer of an all-reduce, the gathered (total)
size of an all-gather or reduce-scatter, the per-rank send buffer of an all-to-all.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from mpsim.cost import nccl, torus
from mpsim.cost.links import (LinkCost, in_switch_link, network_taper, scale_out_link, scale_up_link,
                              transfer_s)
from mpsim.cost.nccl import KINDS, Estimate, GpuGroup
from mpsim.cost.topology import GroupPlacement, copy_shapes, levels_climbed, torus_extent
from mpsim.specs.system import SystemSpec

__all__ = ["KINDS", "Estimate", "LinkCost", "choose_algorithm", "collective_time", "network_link", "network_taper_of",
           "p2p_time", "priced_copies", "scale_out_link", "scale_up_link"]


def levels_of(place: GroupPlacement, system: SystemSpec) -> int | None:
    """Fat-tree levels a group climbs above the leaf (None on a network without levels)."""
    levels = system.scale_out.levels
    if not levels:
        return None
    return levels_climbed(place.node_ids(system.devices_per_node), [level.nodes for level in levels])


def network_taper_of(place: GroupPlacement, system: SystemSpec) -> float:
    """Oversubscription felt by the traffic of a group (or pair) between its nodes; 1 inside one node."""
    if place.nodes <= 1:
        return 1.0
    return network_taper(system, levels_of(place, system))


def network_link(place: GroupPlacement, system: SystemSpec) -> LinkCost:
    """Per-rank link across nodes for a group's traffic: its share of the NICs after the taper it feels."""
    return scale_out_link(system, network_taper_of(place, system))


def priced_copies(place: GroupPlacement, system: SystemSpec) -> tuple[GroupPlacement, ...]:
    """The copies of a group that sit differently on nodes and fat-tree levels (just the group when it has none).

    Inside a TPU slice the group is priced where it sits: every copy of a layout's group covers
    the same torus extent.
    """
    if not place.world or system.scale_up.topology == "torus":
        return (place,)
    return copy_shapes(place, system.devices_per_node, tuple(level.nodes for level in system.scale_out.levels))


def gpu_group(place: GroupPlacement, system: SystemSpec) -> GpuGroup:
    """The group as NCCL's algorithms see it on this system."""
    up = system.scale_up
    nvls = in_switch_link(system)
    return GpuGroup(
        size=place.size, nodes=place.nodes, per_node=place.per_node,
        intra=scale_up_link(system, place.per_node),
        inter=network_link(place, system),
        base_latency_s=system.collective_base_latency,
        in_switch=nvls,
        in_switch_latency_s=up.in_switch_reduction.latency if up.in_switch_reduction else 0.0,
        in_switch_min_ranks=up.in_switch_reduction.min_devices if up.in_switch_reduction else 0,
        nccl_link=up.nccl_link,
    )


def torus_group(place: GroupPlacement, system: SystemSpec) -> torus.TorusGroup:
    """The part of one slice's torus that the group's members on a slice cover."""
    up = system.scale_up
    assert up.torus is not None
    per_node = system.devices_per_node
    ranks = place.member_ranks(per_node)
    first = ranks[0] // per_node
    chips = [rank % per_node for rank in ranks if rank // per_node == first]
    dims = up.torus.dims
    extent = torus_extent(chips, dims)
    wraps = tuple(extent[axis] == dims[axis] and up.torus.wraps(axis) for axis in range(len(dims)))
    return torus.TorusGroup(tuple(extent), wraps, up.link_bandwidth * up.efficiency, up.step_latency,
                            system.collective_base_latency)


def _torus_estimates(kind: str, message_bytes: float, place: GroupPlacement, system: SystemSpec) -> list[Estimate]:
    """Collectives inside a slice on its torus; across slices, hierarchically over the network."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    ici = torus_group(place, system)
    if place.nodes == 1:
        return [Estimate("torus", torus.collective_s(kind, message_bytes, ici), protocol="")]
    dcn = network_link(place, system)
    k, g, base = place.nodes, place.per_node, system.collective_base_latency
    if kind == "all-to-all":
        remote = (place.size - g) / place.size * message_bytes
        seconds = torus.collective_s(kind, message_bytes * g / place.size, ici) + transfer_s(
            base + (place.size - g) * dcn.step_latency_s, [(remote, dcn)], message_bytes)
        return [Estimate("torus+pairwise", seconds, protocol="")]
    across = lambda phase, size: nccl.ring_on_link(phase, size, k, dcn, base)  # noqa: E731
    inside = lambda phase, size: torus.collective_s(phase, size, ici)  # noqa: E731
    if kind == "all-reduce":
        seconds = inside("reduce-scatter", message_bytes) + across("all-reduce", message_bytes / g) + inside(
            "all-gather", message_bytes)
    elif kind == "all-gather":
        seconds = across("all-gather", message_bytes / g) + inside("all-gather", message_bytes)
    else:
        seconds = inside("reduce-scatter", message_bytes) + across("reduce-scatter", message_bytes / g)
    return [Estimate("torus+ring" if g > 1 else "ring", seconds, protocol="")]


def algorithm_estimates(kind: str, message_bytes: float, place: GroupPlacement, system: SystemSpec) -> list[Estimate]:
    """Every algorithm that applies, with its predicted seconds."""
    if system.scale_up.topology == "torus":
        return _torus_estimates(kind, message_bytes, place, system)
    return nccl.candidates(kind, message_bytes, gpu_group(place, system))


# Choices remembered while a caller holds ``remembering`` (the planner prices the same few
# collectives for thousands of layouts). Keyed on the placement and system *objects*: both
# are immutable (a frozen dataclass, a frozen spec) and each entry holds them, so an id
# cannot be reused for another object while its entry lives, and equal keys mean the same
# inputs. Outside ``remembering`` nothing is kept.
_memo: dict | None = None
MEMO_ENTRIES = 200_000


@contextmanager
def remembering(memo: dict) -> Iterator[dict]:
    """Remember ``choose_algorithm``'s answers in ``memo`` while the block runs."""
    global _memo
    before, _memo = _memo, memo
    try:
        yield memo
    finally:
        _memo = before


def _remembered(key: tuple, held: object, system: SystemSpec, compute):
    """The answer remembered under ``key`` while ``remembering``: keys name objects by ``id``,
    so an entry holds them and is used only while they are the very objects asked about."""
    known = _memo.get(key)
    if known is not None and known[0] is held and known[1] is system:
        return known[2]
    answer = compute()
    if len(_memo) >= MEMO_ENTRIES:
        _memo.clear()
    _memo[key] = (held, system, answer)
    return answer


def choose_algorithm(kind: str, message_bytes: float, place: GroupPlacement, system: SystemSpec) -> Estimate:
    """The fastest algorithm for this collective, group and size (what NCCL's tuner would pick).

    A group standing for its copies gets the estimate of its slowest copy.
    """
    if _memo is None:
        return _choose_algorithm(kind, message_bytes, place, system)
    return _remembered((kind, message_bytes, id(place), id(system)), place, system,
                       lambda: _choose_algorithm(kind, message_bytes, place, system))


def _choose_algorithm(kind: str, message_bytes: float, place: GroupPlacement, system: SystemSpec) -> Estimate:
    if place.size <= 1 or message_bytes <= 0:
        if kind not in KINDS:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
        return Estimate("none", 0.0)
    return max((min(algorithm_estimates(kind, message_bytes, copy, system), key=lambda estimate: estimate.time_s)
                for copy in priced_copies(place, system)), key=lambda estimate: estimate.time_s)


def collective_time(kind: str, message_bytes: float, place: GroupPlacement, system: SystemSpec) -> float:
    """Seconds for ``kind`` on a group placed as ``place`` (message as nccl-tests sizes it)."""
    return choose_algorithm(kind, message_bytes, place, system).time_s


def p2p_time(message_bytes: float, pair: GroupPlacement | bool, system: SystemSpec) -> float:
    """A point-to-point send between two ranks (pipeline activations and gradients).

    ``pair``: the placement of the two ranks (:func:`~mpsim.cost.topology.pipeline_pair`
    for two pipeline stages, standing for the same pair in every replica: the slowest copy
    sets the time), or only whether they share a node. Inside a node the send uses the
    link between the two devices: the device's whole fabric behind a switch, one peer link
    on a full mesh or a torus (pipeline neighbours are taken to be torus neighbours).
    Across nodes it uses the sender's share of the NICs through :func:`network_link`, with
    the taper of the levels the two nodes climb. Given only ``False``, the two nodes are
    taken to hang below one leaf switch.
    """
    if message_bytes <= 0:
        return 0.0
    if _memo is None:
        return _p2p_time(message_bytes, pair, system)
    # a placement is keyed on its object (held by the entry), a bare same-node flag on its value
    # (five items: never one of choose_algorithm's four-item keys)
    key = ("p2p", message_bytes, id(pair) if isinstance(pair, GroupPlacement) else bool(pair), id(system), None)
    return _remembered(key, pair, system, lambda: _p2p_time(message_bytes, pair, system))


def _p2p_time(message_bytes: float, pair: GroupPlacement | bool, system: SystemSpec) -> float:
    if isinstance(pair, GroupPlacement):
        return max(_p2p_s(message_bytes, copy.nodes == 1, copy, system) for copy in priced_copies(pair, system))
    return _p2p_s(message_bytes, pair, None, system)


def _p2p_s(message_bytes: float, same_node: bool, pair: GroupPlacement | None, system: SystemSpec) -> float:
    up = system.scale_up
    if same_node:
        bandwidth = up.bandwidth_per_device if up.topology == "switch" else up.link_bandwidth
        link = LinkCost(bandwidth * up.efficiency, up.step_latency)
    elif pair is not None:
        link = network_link(pair, system)
    else:
        link = scale_out_link(system, network_taper(system, None if not system.scale_out.levels else 0))
    return system.collective_base_latency + link.step_latency_s + message_bytes / link.bandwidth
