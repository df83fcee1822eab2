"""Where one rank's GPU time went, per profiler step: plain numbers, no formatting.

A step is a ``ProfilerStep#N`` range on the CPU; the GPU runs its kernels later (in one of
the traces here, 160 ms later), so a step's window on the GPU is taken from its kernels:
from the start of the first kernel launched in the step to the start of the first kernel
launched in the next one (the last step: to the end of its last kernel). The windows tile
the GPU timeline, every kernel interval is clipped to the window, and ``busy_s + idle_s ==
span_s`` exactly. A trace without steps is one window, from its first kernel's start to its
last kernel's end.

* ``busy_s``: the union of all kernel intervals on all streams; ``idle_s`` the rest.
* per category (and per collective kind): the union of that category's kernels, so the
  categories may add up to more than ``busy_s`` where streams overlap.
* overlap: time where a collective kernel and a non-collective kernel run at once, as a
  share of the collectives' union; and what it costs compute: for GEMM shapes that ran
  both alone and entirely beside a collective (``concurrency.py``), how much longer they
  took beside it.
* GEMM shapes and collectives: the kernels that start in the window, grouped. Achieved
  FLOP/s is ``2 B M N K`` over the mean duration; collective bandwidths follow nccl-tests:
  ``algbw = message_bytes / time`` and ``busbw = algbw x bus_factor(kind, n)``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from mpsim.errors import InputError
from mpsim.specs.calibration import gemm_misaligned
from mpsim.traces.concurrency import Beside, beside_shares
from mpsim.traces.intervals import intersection, length, merged
from mpsim.traces.model import CATEGORIES, Kernel, Trace
from mpsim.traces.shapes import DTYPE_BYTES

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv", "broadcast", "reduce",
                    "other")


def bus_factor(kind: str, group_size: int | None) -> float | None:
    """nccl-tests' bus-bandwidth factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
    all-to-all (n-1)/n; send-recv, broadcast and reduce 1 (None when n is unknown and needed)."""
    if kind in ("send-recv", "broadcast", "reduce"):
        return 1.0
    if group_size is None or group_size < 1:
        return None
    if kind == "all-reduce":
        return 2.0 * (group_size - 1) / group_size
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (group_size - 1) / group_size
    return None


@dataclass(frozen=True)
class WindowTime:
    """GPU time in one step's window (seconds)."""

    step: int | None
    start_s: float
    end_s: float
    busy_s: float
    idle_s: float
    category_s: dict[str, float]  # union per category, every category of CATEGORIES
    collective_kind_s: dict[str, float]  # union per collective kind present
    collective_s: float  # union of all collective kernels
    overlap_s: float  # collective and non-collective kernels at once

    @property
    def span_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class GemmRow:
    """Every GEMM kernel of one shape, dtype and op."""

    op: str
    batch: int
    m: int
    n: int
    k: int
    dtype: str
    count: int
    total_s: float
    mean_s: float
    achieved_flop_rate: float | None  # FLOP/s: 2 B M N K / mean_s (None when every one took 0 us)
    # a dimension off the 16-byte vector: the library runs element-at-a-time (align1) kernels
    misaligned: bool = False


@dataclass(frozen=True)
class CollectiveRow:
    """Every collective kernel of one kind, algorithm, protocol, group size and message size."""

    kind: str
    algorithm: str | None
    protocol: str | None
    group_size: int | None
    message_bytes: float | None
    count: int
    total_s: float
    mean_s: float
    algbw_bytes_per_s: float | None  # message_bytes / mean_s
    busbw_bytes_per_s: float | None  # algbw x bus_factor(kind, group_size)
    # the same from the last rank's start, where the traces of every rank of the group show every
    # kernel of the row (``peers.py``); None otherwise
    transfer_mean_s: float | None = None
    transfer_busbw_bytes_per_s: float | None = None


@dataclass(frozen=True)
class BesideCollective:
    """How much slower GEMMs ran entirely beside a collective than alone, shape by shape.

    For each GEMM shape that ran both alone (no other stream's kernel beside it) and
    entirely beside a collective of another stream, the ratio of its median times there;
    the figures are over those shapes. mpsim prices compute beside a collective at
    ``1 / (1 - collective_channels / SMs)`` of its time alone (``CostModel.overlapped_s``)."""

    shapes: int
    median_ratio: float
    min_ratio: float
    max_ratio: float
    alone_kernels: int
    beside_kernels: int


@dataclass(frozen=True)
class TraceSummary:
    """One rank's summary over the chosen steps: times are means per step."""

    source: str
    rank: int | None
    world_size: int | None
    device_name: str | None
    steps: tuple[int | None, ...]  # the windows averaged (None: the whole trace, no steps recorded)
    span_s: float  # the step's window on the GPU
    cpu_step_s: float | None  # the ProfilerStep range on the CPU (None without steps)
    busy_s: float
    idle_s: float
    category_s: dict[str, float]
    collective_kind_s: dict[str, float]
    collective_s: float
    overlap_s: float
    overlap_share: float | None  # overlap_s / collective_s (None without collectives)
    gemms: tuple[GemmRow, ...]  # by total time, largest first
    collectives: tuple[CollectiveRow, ...]  # by total time, largest first
    gemm_kernels: int  # GEMM kernels in the windows; those with a shape are in ``gemms``
    collective_kernels: int
    windows: tuple[WindowTime, ...]
    beside_collective: BesideCollective | None = None  # None: no shape ran both alone and beside a collective
    # inside the collective kernels found on every rank of their group (``peers.py``): per step,
    # the time this rank waited for its slowest peer (kernel time less transfer) and those kernels'
    # time; None when no collective was found on every rank
    peer_wait_s: float | None = None
    peer_matched_s: float | None = None


def window_time(kernels: list[Kernel], step: int | None, lo: float, hi: float) -> WindowTime:
    """The GPU time of ``kernels`` clipped to ``[lo, hi]``."""
    spans = [(k.start_s, k.end_s) for k in kernels]
    busy = length(merged(spans, lo, hi))
    by_category = {c: length(merged([(k.start_s, k.end_s) for k in kernels if k.category == c], lo, hi))
                   for c in CATEGORIES}
    kinds: dict[str, list] = defaultdict(list)
    for k in kernels:
        if k.collective is not None:
            kinds[k.collective.kind].append((k.start_s, k.end_s))
    by_kind = {kind: length(merged(kinds[kind], lo, hi)) for kind in COLLECTIVE_KINDS if kind in kinds}
    comms = merged([(k.start_s, k.end_s) for k in kernels if k.category == "collective"], lo, hi)
    compute = merged([(k.start_s, k.end_s) for k in kernels if k.category != "collective"], lo, hi)
    return WindowTime(step=step, start_s=lo, end_s=hi, busy_s=busy, idle_s=(hi - lo) - busy, category_s=by_category,
                      collective_kind_s=by_kind, collective_s=length(comms), overlap_s=intersection(comms, compute))


def _gemm_rows(kernels: list[Kernel]) -> tuple[GemmRow, ...]:
    groups: dict[tuple, list[float]] = defaultdict(list)
    for k in kernels:
        if k.gemm is not None:
            g = k.gemm
            groups[(g.op, g.batch, g.m, g.n, g.k, g.dtype)].append(k.duration_s)
    rows = []
    for (op, batch, m, n, k, dtype), durations in groups.items():
        total = sum(durations)
        mean = total / len(durations)
        rate = 2.0 * batch * m * n * k / mean if mean > 0 else None  # traces round to 1 us: 0 happens
        misaligned = dtype in DTYPE_BYTES and gemm_misaligned(m, n, k, DTYPE_BYTES[dtype])
        rows.append(GemmRow(op, batch, m, n, k, dtype, len(durations), total, mean, rate, misaligned))
    return tuple(sorted(rows, key=lambda r: (-r.total_s, r.op, r.batch, r.m, r.n, r.k, r.dtype)))


def _busbw(size: float | None, seconds: float | None, factor: float | None) -> float | None:
    """nccl-tests' bus bandwidth of ``size`` bytes in ``seconds`` (None where one is unknown)."""
    if size is None or seconds is None or seconds <= 0 or factor is None:
        return None
    return size / seconds * factor


def _collective_rows(kernels: list[Kernel], transfer_s: dict[int, float]) -> tuple[CollectiveRow, ...]:
    """Rows of collective kernels; ``transfer_s`` (by ``id`` of the kernel) their times without the
    wait for peers, where known."""
    groups: dict[tuple, list[Kernel]] = defaultdict(list)
    for k in kernels:
        if k.collective is not None:
            c = k.collective
            groups[(c.kind, c.algorithm, c.protocol, c.group_size, c.message_bytes)].append(k)
    rows = []
    for (kind, algorithm, protocol, group, size), members in groups.items():
        total = sum(k.duration_s for k in members)
        mean = total / len(members)
        factor = bus_factor(kind, group)
        algbw = size / mean if size is not None and mean > 0 else None
        transfers = [transfer_s[id(k)] for k in members if id(k) in transfer_s]
        transfer = sum(transfers) / len(transfers) if len(transfers) == len(members) else None
        rows.append(CollectiveRow(kind, algorithm, protocol, group, size, len(members), total, mean, algbw,
                                  _busbw(size, mean, factor), transfer, _busbw(size, transfer, factor)))

    def order(row: CollectiveRow):
        return (-row.total_s, row.kind, row.algorithm or "", row.protocol or "", row.group_size or 0,
                row.message_bytes if row.message_bytes is not None else -1.0)

    return tuple(sorted(rows, key=order))


def _beside_collective(kernels: list[Kernel], shares: dict[int, Beside]) -> BesideCollective | None:
    alone: dict[tuple, list[float]] = defaultdict(list)
    beside: dict[tuple, list[float]] = defaultdict(list)
    for kernel in kernels:
        if kernel.gemm is None or kernel.duration_s <= 0:
            continue
        g, share = kernel.gemm, shares[id(kernel)]
        key = (g.op, g.batch, g.m, g.n, g.k, g.dtype)
        if share.alone:
            alone[key].append(kernel.duration_s)
        elif share.within_collective:
            beside[key].append(kernel.duration_s)
    both = sorted(key for key in beside if key in alone)
    if not both:
        return None
    ratios = [statistics.median(beside[key]) / statistics.median(alone[key]) for key in both]
    return BesideCollective(len(both), statistics.median(ratios), min(ratios), max(ratios),
                            sum(len(alone[key]) for key in both), sum(len(beside[key]) for key in both))


def _windows(trace: Trace, step: int | None) -> list[tuple[int | None, float, float, float | None]]:
    """``(step, start_s, end_s, cpu_s)`` of every window on the GPU (see the module's docstring);
    checks that ``step`` is one of them."""
    launched: dict[int, list[Kernel]] = defaultdict(list)
    for k in trace.kernels:
        if k.step is not None:
            launched[k.step].append(k)
    steps = [s for s in trace.steps if launched.get(s.number)]
    if step is not None and not any(s.number == step for s in trace.steps):
        known = ", ".join(str(s.number) for s in trace.steps) or "none"
        raise InputError(f"no ProfilerStep#{step} in this trace (steps: {known})", trace.source, "--step")
    if step is not None and not launched.get(step):
        raise InputError(f"no kernel launch recorded in ProfilerStep#{step}", trace.source, "--step")
    if not steps:
        return [(None, min(k.start_s for k in trace.kernels), max(k.end_s for k in trace.kernels), None)]
    windows = []
    for index, s in enumerate(steps):
        start = min(k.start_s for k in launched[s.number])
        if index + 1 < len(steps):
            end = min(k.start_s for k in launched[steps[index + 1].number])
        else:
            end = max(k.end_s for k in launched[s.number])
        windows.append((s.number, start, max(start, end), s.end_s - s.start_s))
    return windows


def summarize(trace: Trace, step: int | None = None, transfer_s: dict[int, float] | None = None) -> TraceSummary:
    """The summary of one rank's trace over one step (``step``) or averaged over all its
    steps (the whole trace when it recorded none); ``transfer_s`` (by the kernel's index in
    ``trace.kernels``) times collectives from their last rank's start (``peers.py``)."""
    if not trace.kernels:
        raise InputError("no GPU kernels to summarize", trace.source)
    windows = _windows(trace, step)
    times, chosen, cpu_s = [], [], []
    for index, (number, lo, hi, cpu) in enumerate(windows):
        if step is not None and number != step:
            continue
        inside = [k for k in trace.kernels if k.end_s > lo and k.start_s < hi]
        times.append(window_time(inside, number, lo, hi))
        last = index == len(windows) - 1  # the last window also keeps a 0 us kernel at its very end
        chosen.extend(k for k in trace.kernels if lo <= k.start_s < hi or (last and k.start_s == hi))
        cpu_s.append(cpu)
    n = len(times)

    def mean(values) -> float:
        return sum(values) / n

    kinds = [kind for kind in COLLECTIVE_KINDS if any(kind in t.collective_kind_s for t in times)]
    by_id = {id(trace.kernels[i]): seconds for i, seconds in (transfer_s or {}).items()}
    matched = [k for k in chosen if id(k) in by_id]
    collective_s = mean(t.collective_s for t in times)
    overlap_s = mean(t.overlap_s for t in times)
    return TraceSummary(
        source=trace.source, rank=trace.rank, world_size=trace.world_size, device_name=trace.device_name,
        steps=tuple(t.step for t in times), span_s=mean(t.span_s for t in times),
        cpu_step_s=mean(cpu_s) if None not in cpu_s else None, busy_s=mean(t.busy_s for t in times),
        idle_s=mean(t.idle_s for t in times),
        category_s={c: mean(t.category_s[c] for t in times) for c in CATEGORIES},
        collective_kind_s={kind: mean(t.collective_kind_s.get(kind, 0.0) for t in times) for kind in kinds},
        collective_s=collective_s, overlap_s=overlap_s,
        overlap_share=overlap_s / collective_s if collective_s > 0 else None,
        gemms=_gemm_rows(chosen),
        collectives=_collective_rows(chosen, by_id),
        gemm_kernels=sum(k.category == "gemm" for k in chosen),
        collective_kernels=sum(k.category == "collective" for k in chosen), windows=tuple(times),
        beside_collective=_beside_collective(chosen, beside_shares(trace.kernels)),
        peer_wait_s=sum(k.duration_s - by_id[id(k)] for k in matched) / n if matched else None,
        peer_matched_s=sum(k.duration_s for k in matched) / n if matched else None)
