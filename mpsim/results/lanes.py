"""What a timeline picture can show: which pipeline ranks get a lane, and dense runs merged.

A picture has a fixed number of pixels, and a step of a large job has more than that:
64 pipeline ranks stacked at a readable lane height make a picture taller than a screen,
and hundreds of microbatches put several actions into each pixel column, where their
edges beat against the pixel grid (moiré). Both are fixed here, before anything is
drawn, so the drawing code only ever sees what fits:

* :func:`choose_ranks` keeps every rank when they fit and otherwise a representative
  subset: the first and last rank, the busiest one (most compute), and ranks evenly
  spaced between them; each kept rank says why it was kept.
* :func:`merge_runs` joins spans that are closer than a pixel into one bar, so a run of
  actions too narrow to tell apart is drawn as the run it looks like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Lane:
    """One pipeline rank drawn in the picture, and why it was picked when not all were."""

    rank: int
    role: str  # "" when every rank is drawn or for the evenly spaced ones; else "first", "last", "busiest" or two of them


def choose_ranks(busy_s: Sequence[float], limit: int) -> list[Lane]:
    """The ranks to draw, in rank order: all when at most ``limit``, else a subset of ``limit``.

    ``busy_s`` is each rank's time on its compute stream. Ties for the busiest rank go to
    the lowest rank, so the choice is the same for the same step.
    """
    count = len(busy_s)
    if limit < 3:
        raise ValueError(f"a timeline needs room for at least 3 lanes, got {limit}")
    if count <= limit:
        return [Lane(rank, "") for rank in range(count)]
    busiest = max(range(count), key=lambda rank: (busy_s[rank], -rank))
    chosen = {0: "first", count - 1: "last"}
    chosen[busiest] = f"{chosen[busiest]}, busiest" if busiest in chosen else "busiest"
    # evenly spaced: the ranks nearest to limit points spread over 0..count-1, until full
    slots = limit
    while len(chosen) < limit:
        for i in range(slots):
            rank = round(i * (count - 1) / (slots - 1))
            if len(chosen) < limit:
                chosen.setdefault(rank, "")
        slots += 1
    return [Lane(rank, chosen[rank]) for rank in sorted(chosen)]


def merge_runs(spans: Sequence[tuple[float, float]], max_gap: float) -> list[tuple[float, float]]:
    """(start, width) spans joined into one wherever the gap between neighbours is at most ``max_gap``.

    The input need not be sorted; the output is sorted by start. ``max_gap=0`` joins only
    overlapping or touching spans.
    """
    merged: list[list[float]] = []
    for start, width in sorted(spans):
        end = start + width
        if merged and start - merged[-1][1] <= max_gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end - start) for start, end in merged]
