"""How much the same kernel's time varies from one training step to the next, per op kind.

A training loop launches the same kernels in the same order every step, so the i-th
launch of a kernel name in step s does the same work as the i-th launch of that name in
step s + 1. Grouping by (name, position within the step) therefore pairs up repeats of
one piece of work without needing its shapes, and a group's coefficient of variation
(sample standard deviation over mean) is the run-to-run variation of that op as the job
saw it: clocks, memory traffic of the other streams, and for NCCL kernels the wait for
the slowest peer.

A name is used only where every step launched it the same number of times (otherwise
the positions do not pair up), and a group only with three steps or more. A kind's
figure is the median of its groups' variations, each group weighted by its total time,
so that long kernels, which decide step time, decide the figure; tiny kernels whose
times are a few microseconds of launch jitter count little.

Trace categories map to the op kinds of ``mpsim/reliability/op_variation.py``: ``gemm``
to gemm, ``attention`` to attention, ``elementwise`` to memory, ``collective`` to
collective. Pipeline transfers are not told apart from other NCCL send/receive kernels
in a trace, so ``transfer`` is not measured here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from mpsim.traces.model import Trace

KIND_OF_CATEGORY = {"gemm": "gemm", "attention": "attention", "elementwise": "memory", "collective": "collective"}
MIN_STEPS = 3


@dataclass(frozen=True)
class KindVariation:
    """One op kind's step-to-step variation on one trace."""

    kind: str
    cv: float  # time-weighted median of the groups' coefficients of variation
    groups: int  # kernels (name, position) seen in every step
    kernels: int  # launches behind them
    seconds: float  # their total time


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The value at which the weights below reach half the total (the lower one on a tie)."""
    pairs = sorted(zip(values, weights))
    half = sum(weights) / 2.0
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= half:
            return value
    return pairs[-1][0]


def step_groups(trace: Trace) -> dict[tuple[str, int], list[tuple[str, float]]]:
    """(kernel name, position among that name's launches in its step) -> [(category, seconds) per step],
    for names launched equally often in every step of a trace with ``MIN_STEPS`` steps or more."""
    per_step: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for kernel in trace.kernels:
        if kernel.step is not None:
            per_step[kernel.step][kernel.name].append(kernel)
    steps = sorted(per_step)
    if len(steps) < MIN_STEPS:
        return {}
    names = set.intersection(*(set(per_step[s]) for s in steps))
    groups: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for name in sorted(names):
        counts = {len(per_step[s][name]) for s in steps}
        if len(counts) != 1:
            continue
        for position in range(counts.pop()):
            groups[(name, position)] = [(per_step[s][name][position].category,
                                         per_step[s][name][position].duration_s) for s in steps]
    return groups


def kind_variation(traces: list[Trace]) -> dict[str, KindVariation]:
    """Each measured op kind's variation over the groups of all ``traces`` (one device's runs),
    pooled; kinds without a usable group are absent."""
    by_kind: dict[str, list[tuple[float, float, int]]] = defaultdict(list)  # (cv, seconds, launches)
    for repeats in (group for trace in traces for group in step_groups(trace).values()):
        categories = {category for category, _ in repeats}
        kind = KIND_OF_CATEGORY.get(categories.pop()) if len(categories) == 1 else None
        if kind is None:
            continue
        seconds = [s for _, s in repeats]
        mean = sum(seconds) / len(seconds)
        if mean <= 0:
            continue
        std = math.sqrt(sum((s - mean) ** 2 for s in seconds) / (len(seconds) - 1))
        by_kind[kind].append((std / mean, sum(seconds), len(seconds)))
    return {kind: KindVariation(kind, weighted_median([r[0] for r in rows], [r[1] for r in rows]), len(rows),
                                sum(r[2] for r in rows), sum(r[1] for r in rows))
            for kind, rows in sorted(by_kind.items())}
