"""Interval arithmetic on kernel times: unions, their lengths and their overlaps.

Kernels of one GPU run on several streams, so their busy times are sets of intervals
that may overlap; what a trace reader asks of them (how long the GPU was busy, how long
communication ran beside compute, how much of one kernel other streams covered) is the
union of intervals, its length and the length two unions share.
"""

from __future__ import annotations


def merged(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The union of ``intervals`` clipped to ``[lo, hi]``, as disjoint sorted intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        start, end = max(start, lo), min(end, hi)
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds two disjoint sorted interval lists have in common."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
