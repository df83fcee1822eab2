"""The links a collective runs on, and how long bytes take on them.

A :class:`LinkCost` is one level of the machine seen from one rank: the bandwidth it
reaches on large messages, the latency of one algorithm step across it, and the shape
of its measured bandwidth-versus-size curve.

Why a curve and not only alpha-beta: nccl-tests bus bandwidth climbs to its peak far
more slowly than NCCL's per-step latencies imply (8x A100 all-reduce: 106 GB/s at
16 MiB, 229 GB/s at 1 GiB, 235 GB/s at 16 GiB). The library pipelines each step in
chunks and raises its channel count and chunk size with the message, so the start-up
cost grows with the message too. Fitted to the measured curves, the bus bandwidth
follows ``peak / (1 + (n_half / S) ** k)``: Hockney's half-bandwidth size ``n_half``
(the size at half the peak) with an exponent ``k``; ``k = 1`` is Hockney's own curve,
an alpha-beta model with ``alpha = n_half / peak``. A collective takes whichever is
longer: its latency terms plus its bytes at peak, or its bytes at the curve's bandwidth;
an algorithm that uses several links takes the slowest of them under each.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.specs.system import SystemSpec


@dataclass(frozen=True)
class LinkCost:
    """Alpha-beta parameters and measured curve shape of one level of the machine, per rank."""

    bandwidth: float  # bytes/s one rank reaches on large messages, one direction
    step_latency_s: float
    half_bandwidth_bytes: float = 0.0  # Hockney's n_1/2 of the measured collective curve
    curve_exponent: float = 1.0

    def curve_factor(self, message_bytes: float) -> float:
        """How many times longer than at peak bandwidth a message of this size takes."""
        if self.half_bandwidth_bytes <= 0 or message_bytes <= 0:
            return 1.0
        return 1.0 + (self.half_bandwidth_bytes / message_bytes) ** self.curve_exponent


def transfer_s(latency_s: float, loads: list[tuple[float, LinkCost]], message_bytes: float,
               peak_share: float = 1.0, peak_floor_s: float = 0.0) -> float:
    """Seconds for an algorithm that moves ``bytes`` over each ``link`` of ``loads`` at once.

    The links work in a pipeline, so the slowest one sets the pace: at peak rates, and
    again along each link's measured curve for a message of ``message_bytes`` (the
    nccl-tests size). Taking the slowest link under both keeps the time from ever
    growing when one link gets faster. ``peak_share``: the share of the peak a protocol
    reaches in NCCL's own model (LL: a quarter), and ``peak_floor_s`` the least time its
    bytes take there (NCCL's cap on the protocol's bandwidth); the measured curves hold what
    the library reached with the protocols it chose, so they are not scaled.
    """
    loads = [(volume, link) for volume, link in loads if volume > 0]
    if not loads:
        return latency_s
    peak_s = max(max(volume / link.bandwidth for volume, link in loads) / peak_share, peak_floor_s)
    curve_s = max(volume / link.bandwidth * link.curve_factor(message_bytes) for volume, link in loads)
    return max(latency_s + peak_s, curve_s)


def scale_up_link(system: SystemSpec, members: int | None = None) -> LinkCost:
    """Per-device link inside a node for a group with ``members`` devices on it.

    Behind a switch every device reaches any peer at its full rate. On a full mesh a
    group of ``m`` devices uses only the ``m - 1`` links to its peers.
    """
    up = system.scale_up
    bandwidth = up.bandwidth_per_device
    if up.topology == "full-mesh":
        members = system.devices_per_node if members is None else members
        bandwidth = up.link_bandwidth * max(1, min(members - 1, up.links_per_device or 1))
    return LinkCost(bandwidth * up.efficiency, up.step_latency, up.half_bandwidth_bytes, up.curve_exponent)


def in_switch_link(system: SystemSpec) -> LinkCost | None:
    """Per-device link of in-switch reduction (NVLS), or None where the switches cannot reduce."""
    up = system.scale_up
    nvls = up.in_switch_reduction
    if nvls is None:
        return None
    return LinkCost(up.bandwidth_per_device * nvls.efficiency, 0.0, nvls.half_bandwidth_bytes, nvls.curve_exponent)


def network_taper(system: SystemSpec, levels_climbed: int | None) -> float:
    """Bandwidth divisor from oversubscription for traffic that climbs ``levels_climbed`` levels.

    Traffic that leaves a group of level ``i`` shares that level's uplinks; climbing
    several levels multiplies their tapers. Without levels, one switch level joins all
    nodes and the scalar oversubscription applies to all traffic between nodes
    (``levels_climbed=None``).
    """
    out = system.scale_out
    if not out.levels or levels_climbed is None:
        return out.oversubscription
    taper = 1.0
    for index in range(min(levels_climbed, len(out.levels))):
        taper *= out.level_oversubscription(index)
    return taper


def scale_out_link(system: SystemSpec, taper: float | None = None) -> LinkCost:
    """Per-device share of the node's NICs across nodes, after the fat tree's taper."""
    out = system.scale_out
    per_device = out.nic_bandwidth * out.nics_per_node / system.devices_per_node
    taper = out.oversubscription if taper is None else taper
    return LinkCost(per_device * out.efficiency / taper, out.step_latency, out.half_bandwidth_bytes,
                    out.curve_exponent)
