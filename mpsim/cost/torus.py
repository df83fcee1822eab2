"""Collectives on a TPU torus, axis by axis (the scaling book's model of ICI).

A chip has two links on each torus axis. When the group covers a whole axis that has
wraparound links, the axis is a ring the collective drives in both directions at once:
an all-gather of ``V`` bytes over ``N`` chips on one axis takes ``V (N-1)/N / W_bidir``
(``W_bidir`` = two links' one-way rate). Without wraparound, or on part of an axis,
only a line is left and the time about doubles (Austin et al., *How to Scale Your
Model*, TPU and sharding chapters).

A group spanning several axes splits the array into one piece per axis and gathers each
piece through the axes in a rotated order, so every axis's links are busy at once and
the time divides by the number of axes (exactly so when the axes have equal length; in
general the busiest axis sets the pace). Reduce-scatter mirrors all-gather, all-reduce
is the two in a row, and an all-to-all moves a quarter of an all-gather's bytes on a
bidirectional ring.

Latency: each step crosses one hop (about 1 us); a ring with wraparound needs ``N/2``
hops to reach the far side, a line ``N - 1``. The time is the larger of the latency and
the bandwidth term, as the scaling book writes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TorusGroup:
    """The part of a torus a group covers."""

    extent: tuple[int, ...]  # chips of the group along each axis
    wraps: tuple[bool, ...]  # whether the group closes a ring along each axis
    link_bandwidth: float  # bytes/s of one link, one direction, as achieved
    hop_latency_s: float
    base_latency_s: float = 0.0

    @property
    def axes(self) -> list[int]:
        """Axes along which the group has more than one chip."""
        return [axis for axis, size in enumerate(self.extent) if size > 1]

    @property
    def size(self) -> int:
        """Chips in the group."""
        total = 1
        for size in self.extent:
            total *= size
        return total


def axis_loads(group: TorusGroup, total_bytes: float) -> dict[int, float]:
    """Bytes each chip receives along each axis in a multi-axis all-gather of ``total_bytes``.

    The array is cut into one piece per axis; piece ``r`` is gathered along the axes in
    the order rotated by ``r``. Gathering along an axis of ``n`` chips after axes that
    already multiplied the piece by ``before`` brings in ``piece * before * (n-1) / N``.
    """
    axes = group.axes
    piece = total_bytes / len(axes)
    loads = dict.fromkeys(axes, 0.0)
    for shift in range(len(axes)):
        before = 1
        for axis in axes[shift:] + axes[:shift]:
            size = group.extent[axis]
            loads[axis] += piece * before * (size - 1) / group.size
            before *= size
    return loads


def _terms(group: TorusGroup, total_bytes: float) -> tuple[float, float]:
    """(latency, bandwidth) seconds of an all-gather of ``total_bytes`` over the group."""
    bandwidth_s = 0.0
    latency_s = group.base_latency_s
    for axis, load in axis_loads(group, total_bytes).items():
        ring = group.wraps[axis]
        bandwidth_s = max(bandwidth_s, load / (group.link_bandwidth * (2 if ring else 1)))
        size = group.extent[axis]
        latency_s += group.hop_latency_s * (size / 2 if ring else size - 1)
    return latency_s, bandwidth_s


def collective_s(kind: str, message_bytes: float, group: TorusGroup) -> float:
    """Seconds of ``kind`` on the torus (message as nccl-tests sizes it)."""
    if kind not in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all"):
        raise ValueError(f"unknown collective {kind!r}")
    if group.size <= 1 or message_bytes <= 0:
        return 0.0
    latency_s, bandwidth_s = _terms(group, message_bytes)
    if kind == "all-reduce":
        return 2 * max(latency_s, bandwidth_s)
    if kind == "all-to-all":
        return max(latency_s, bandwidth_s / 4)
    return max(latency_s, bandwidth_s)
