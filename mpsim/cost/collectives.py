"""Seconds for a collective on a group's links: the alpha-beta model NCCL itself uses.

A ring collective over ``n`` ranks takes ``steps`` latency terms plus the bytes each rank
moves over its slowest link: all-reduce ``2(n-1)`` steps and ``2(n-1)/n * S`` bytes,
all-gather and reduce-scatter ``n-1`` steps and ``(n-1)/n * S`` (Thakur et al. 2005;
NCCL's tuning model adds a fixed base latency per call). Measured nccl-tests curves
reach their peak more slowly than those latencies imply; where a system file gives the
half-bandwidth message size ``n_1/2`` of its measured curve (Hockney's characterization),
the bus bandwidth at size ``S`` is taken as ``peak * S / (S + n_1/2)`` instead, whichever
is slower. A group that spans nodes with
several ranks per node runs hierarchically: reduce-scatter inside the node, the
collective across nodes on 1/g of the data, all-gather inside the node.

Bandwidths are the link's datasheet rate times the fraction NCCL reaches on large
messages (its own per-link constants, e.g. 20 of 25 GB/s per NVLink3 link).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.cost.topology import GroupPlacement
from mpsim.specs.system import SystemSpec


@dataclass(frozen=True)
class LinkCost:
    """Alpha-beta parameters of one level of the machine, per rank."""

    bandwidth: float  # bytes/s one rank can push, one direction
    step_latency_s: float
    half_bandwidth_bytes: float = 0.0  # Hockney's n_1/2 of the measured collective curve


def scale_up_link(system: SystemSpec) -> LinkCost:
    """Per-device link inside a node."""
    up = system.scale_up
    return LinkCost(up.bandwidth_per_device * up.efficiency, up.step_latency, up.half_bandwidth_bytes)


def scale_out_link(system: SystemSpec) -> LinkCost:
    """Per-device share of the node's NICs across nodes."""
    out = system.scale_out
    per_device = out.nic_bandwidth * out.nics_per_node / system.devices_per_node
    return LinkCost(per_device * out.efficiency / out.oversubscription, out.step_latency, out.half_bandwidth_bytes)


def ring_time(kind: str, message_bytes: float, n: int, link: LinkCost, base_latency_s: float) -> float:
    """One ring collective over ``n`` ranks on ``link``."""
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if kind == "all-reduce":
        steps, volume = 2 * (n - 1), 2 * (n - 1) / n * message_bytes
    elif kind in ("all-gather", "reduce-scatter"):
        steps, volume = n - 1, (n - 1) / n * message_bytes
    else:
        raise ValueError(f"unknown collective {kind!r}")
    latency_bound = base_latency_s + steps * link.step_latency_s + volume / link.bandwidth
    # measured curves rise more slowly than the latency terms alone say: bus bandwidth
    # follows S / (S + n_1/2) of its peak (fitted to nccl-tests, see the system file)
    measured_shape = volume * (1.0 + link.half_bandwidth_bytes / message_bytes) / link.bandwidth
    return max(latency_bound, measured_shape)


def collective_time(kind: str, message_bytes: float, place: GroupPlacement, system: SystemSpec) -> float:
    """Seconds for ``kind`` on a group placed as ``place`` (message as nccl-tests sizes it)."""
    n = place.size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    base = system.collective_base_latency
    intra, inter = scale_up_link(system), scale_out_link(system)
    if place.nodes == 1:
        return ring_time(kind, message_bytes, n, intra, base)
    if place.per_node == 1:
        return ring_time(kind, message_bytes, n, inter, base)
    g, k = place.per_node, place.nodes
    if kind == "all-reduce":
        return (ring_time("reduce-scatter", message_bytes, g, intra, base)
                + ring_time("all-reduce", message_bytes / g, k, inter, base)
                + ring_time("all-gather", message_bytes, g, intra, base))
    if kind == "all-gather":
        return (ring_time("all-gather", message_bytes / g, k, inter, base)
                + ring_time("all-gather", message_bytes, g, intra, base))
    if kind == "reduce-scatter":
        return (ring_time("reduce-scatter", message_bytes, g, intra, base)
                + ring_time("reduce-scatter", message_bytes / g, k, inter, base))
    raise ValueError(f"unknown collective {kind!r}")


def p2p_time(message_bytes: float, same_node: bool, system: SystemSpec) -> float:
    """A point-to-point send between two ranks (pipeline activations and gradients)."""
    if message_bytes <= 0:
        return 0.0
    link = scale_up_link(system) if same_node else scale_out_link(system)
    return system.collective_base_latency + link.step_latency_s + message_bytes / link.bandwidth
