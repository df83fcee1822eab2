"""Collective kernels: the datasheet's price and alpha-beta lines fitted per kind, algorithm and group.

NCCL picks an algorithm (RING, TREE, ...) and a protocol (LL, LL128, SIMPLE) per call,
and their costs differ by an order of magnitude at small sizes, so one line is fitted per
``(kind, algorithm, protocol, group size)`` seen in the traces::

    t = latency_s + message_bytes / bandwidth

with message sizes as nccl-tests counts them (``Collective.message_bytes``), by the same
robust non-negative fit as GEMMs. A line needs two distinct sizes; with one, both numbers
cannot be told apart, and its kernels stay priced by the datasheet. Where the time does
not grow with size over the sizes seen, the line is its latency alone (``bandwidth``
null) rather than a made-up bandwidth. A line prices sizes up to the largest it saw.

A collective kernel's time in a trace includes any wait for the slowest peer to arrive,
which no per-size line can know: a trace whose ranks are out of step shows collectives
far slower than the links, and the fit (and its held-out error) says so.

Before fitting, a collective is priced by mpsim's NCCL model (``mpsim/cost/collectives.py``)
on the system's links, the group taken to fill nodes in order. Broadcast, reduce and
send-recv, which that model does not price as collectives, are one point-to-point
transfer plus the collective base latency. A group whose size the trace did not record
is priced as the whole job (the trace's world size) for that comparison only; its line
is written with ``ranks: null`` and prices nothing later.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from mpsim.calibrate.trace_fit.robust import fit_nonnegative
from mpsim.calibrate.trace_fit.samples import CollectiveSample
from mpsim.cost.collectives import KINDS, collective_time, p2p_time
from mpsim.cost.topology import GroupPlacement
from mpsim.specs.calibration import CollectiveFit, SizePoint
from mpsim.specs.system import SystemSpec


def placement(ranks: int, system: SystemSpec) -> GroupPlacement:
    """A group of ``ranks`` consecutive devices, filling nodes in order."""
    per_node = min(ranks, system.devices_per_node)
    return GroupPlacement(ranks, math.ceil(ranks / per_node), per_node)


def datasheet_seconds(sample: CollectiveSample, system: SystemSpec, ranks: int) -> float:
    """The unfitted model's time for one collective kernel on a group of ``ranks``."""
    place = placement(max(ranks, 2), system)
    if sample.kind in KINDS:
        return collective_time(sample.kind, sample.message_bytes, place, system)
    return system.collective_base_latency + p2p_time(sample.message_bytes, place.nodes == 1, system)


def _points(group: list[CollectiveSample]) -> list[SizePoint]:
    """One point per size: the median time, the spread of its kernels and how many."""
    by_size: dict[float, list[float]] = defaultdict(list)
    for sample in group:
        by_size[sample.message_bytes].append(sample.seconds)
    points = []
    for size in sorted(by_size):
        times = np.array(by_size[size])
        median = float(np.median(times))
        q75, q25 = np.percentile(times, [75, 25])
        points.append(SizePoint(bytes=size, seconds=median, spread=float((q75 - q25) / median), samples=len(times)))
    return points


def fit_collectives(samples: list[CollectiveSample]) -> tuple[list[CollectiveFit], dict[str, int]]:
    """One alpha-beta line per (kind, algorithm, protocol, group size) with two sizes or more;
    and the kernels left unfitted, by reason."""
    groups: dict[tuple, list[CollectiveSample]] = defaultdict(list)
    for sample in samples:
        groups[sample.group].append(sample)
    fits, skipped = [], {}
    for key in sorted(groups):
        group = groups[key]
        kind, algorithm, protocol, ranks = key
        label = f"{kind} {algorithm or '?'} {protocol or '?'} on {ranks or 'unknown'} ranks"
        if len({s.message_bytes for s in group}) < 2:
            skipped[f"{label} (one message size: no line)"] = len(group)
            continue
        features = np.array([[1e-6, s.message_bytes / 1e9] for s in group])
        seconds = np.array([s.seconds for s in group])
        latency, per_byte = fit_nonnegative(features, seconds)
        # a line whose time does not grow with size keeps only its latency (bandwidth null)
        fit = CollectiveFit(kind=kind, ranks=ranks or None, algorithm=algorithm or None, protocol=protocol or None,
                            latency_s=float(latency) * 1e-6, bandwidth=float(1e9 / per_byte) if per_byte > 0 else None,
                            points=_points(group), kernels=len(group),
                            max_bytes=max(s.message_bytes for s in group))
        errors = [fit.seconds(s.message_bytes) / s.seconds - 1.0 for s in group]
        fits.append(fit.model_copy(update={"rms_error": float(np.sqrt(np.mean(np.square(errors))))}))
    return fits, skipped


def fitted_seconds(sample: CollectiveSample, fits: list[CollectiveFit]) -> float | None:
    """The fitted line of the sample's own kind, algorithm, protocol and group, if there is one."""
    for fit in fits:
        if (fit.kind, fit.algorithm or "", fit.protocol or "", fit.ranks or 0) == sample.group:
            return fit.seconds(sample.message_bytes) if fit.covers(sample.message_bytes) else None
    return None
