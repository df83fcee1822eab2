"""What a trace's kernels say about cost: timed GEMMs, collectives, memory-bound kernels, gaps.

A profiler trace times every kernel, but only some of them can be priced by the model:
a GEMM when its launching op recorded the operands' shapes, a collective when the trace
gives its message size, an elementwise kernel when its op's tensors are sized and it is
the op's only kernel. This module picks those out of a :class:`~mpsim.traces.model.Trace`
as plain samples, and counts what it had to skip and why, so the fit can say how much of
the trace it used.

A GEMM's time is its product kernel plus the split-K reduction cuBLAS runs after it for
the same call (both are the matrix product the op asked for; the reduction exists only
because the library split K over several tiles), but not the layout copies an
``aten::mm`` may launch before it.

Each GEMM sample also carries the shares of its time during which other streams ran
kernels beside it (``mpsim/traces/concurrency.py``), so that a check of predictions
can price it as it ran: slowed where a collective held some of the SMs.

A collective's time is its transfer where the traces of every rank of its group show it:
from the last rank's start to the kernel's end (``mpsim/traces/peers.py``); elsewhere it
is the kernel's duration, which holds the wait for the slowest peer.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from mpsim.traces.concurrency import Beside, beside_shares
from mpsim.traces.host import launch_intervals_by_pass
from mpsim.traces.model import Kernel, Trace
from mpsim.traces.peers import peer_waits
from mpsim.traces.shapes import DTYPE_BYTES, DTYPES

_SPLIT_K = re.compile(r"splitk", re.IGNORECASE)


@dataclass(frozen=True)
class GemmSample:
    """One matrix-product call: its shape, math mode and the seconds its kernels ran."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str
    seconds: float
    beside_any: float = 0.0  # share of its time another stream's kernel ran beside it
    beside_collective: float = 0.0  # share of its time a collective ran beside it

    @property
    def key(self) -> tuple:
        return (self.dtype, self.batch, self.m, self.n, self.k)

    @property
    def alone(self) -> bool:
        return self.beside_any == 0.0


@dataclass(frozen=True)
class CollectiveSample:
    """One NCCL kernel with a known message size."""

    kind: str
    algorithm: str | None
    protocol: str | None
    ranks: int | None
    message_bytes: float
    seconds: float
    world_size: int | None = None  # ranks in the traced job, for pricing a group of unknown size before fitting

    @property
    def group(self) -> tuple:
        """What one alpha-beta line is fitted over."""
        return (self.kind, self.algorithm or "", self.protocol or "", self.ranks or 0)

    @property
    def key(self) -> tuple:
        return self.group + (self.message_bytes,)


@dataclass(frozen=True)
class MemorySample:
    """One memory-bound kernel and the bytes its op's tensors occupy (inputs read, output written)."""

    op: str
    bytes: float
    seconds: float


@dataclass
class TraceSamples:
    """Everything usable from one or more traces, with counts of what was skipped."""

    gemms: list[GemmSample] = field(default_factory=list)
    collectives: list[CollectiveSample] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    waiting_gaps_s: list[float] = field(default_factory=list)
    queued_gaps_s: list[float] = field(default_factory=list)
    forward_intervals_s: list[float] = field(default_factory=list)  # traces/host.py
    backward_intervals_s: list[float] = field(default_factory=list)
    # per pass kind: every trace's intervals came from inside its annotated passes (traces/host.py)
    forward_within_passes: bool = True
    backward_within_passes: bool = True
    skipped: Counter = field(default_factory=Counter)
    # collective samples timed from their last rank's start (traces/peers.py), and the kernels
    # still timed as they ran, their wait for peers included, by reason
    peer_waits_taken_out: int = 0
    peer_waits_kept: dict[str, int] = field(default_factory=dict)


def gemm_samples(trace: Trace, samples: TraceSamples, shares: dict[int, Beside]) -> None:
    """The trace's matrix products with shapes, each with its split-K reduction's time added
    and the shares of its time beside other streams' kernels (``shares``, by kernel id)."""
    split_k: dict[int, float] = {}  # id of the launching op -> seconds of its split-K kernels
    for kernel in trace.kernels:
        if kernel.category == "gemm" and kernel.gemm is None and kernel.op is not None \
                and _SPLIT_K.search(kernel.name):
            split_k[id(kernel.op)] = split_k.get(id(kernel.op), 0.0) + kernel.duration_s
    for kernel in trace.kernels:
        if kernel.category != "gemm" or _SPLIT_K.search(kernel.name):
            continue
        gemm = kernel.gemm
        if gemm is None:
            samples.skipped["gemm kernels without operand shapes"] += 1
            continue
        if min(gemm.m, gemm.n, gemm.k) <= 1:
            # a matrix-vector product: cuBLAS runs a gemv kernel, a different (memory-bound) model
            samples.skipped["gemm kernels that are matrix-vector products"] += 1
            continue
        if kernel.duration_s <= 0:
            samples.skipped["kernels with zero duration"] += 1
            continue
        extra = split_k.pop(id(kernel.op), 0.0) if kernel.op is not None else 0.0
        beside = shares[id(kernel)]
        samples.gemms.append(GemmSample(gemm.batch, gemm.m, gemm.n, gemm.k, gemm.dtype, kernel.duration_s + extra,
                                        beside.any_kernel, beside.collective))


def collective_samples(trace: Trace, samples: TraceSamples, transfer_s: dict[int, float] | None = None) -> None:
    """The trace's NCCL kernels whose message size the trace gives, each timed by its transfer
    (``transfer_s``, by kernel index: the wait for peers taken out) where known, else as it ran."""
    transfer_s = transfer_s or {}
    for index, kernel in enumerate(trace.kernels):
        collective = kernel.collective
        if kernel.category != "collective" or collective is None:
            continue
        if not collective.message_bytes or collective.message_bytes <= 0:
            samples.skipped["collectives without a message size"] += 1
            continue
        if kernel.duration_s <= 0:
            samples.skipped["kernels with zero duration"] += 1
            continue
        seconds = transfer_s.get(index, kernel.duration_s)
        samples.peer_waits_taken_out += index in transfer_s
        samples.collectives.append(CollectiveSample(collective.kind, collective.algorithm, collective.protocol,
                                                    collective.group_size, float(collective.message_bytes),
                                                    seconds, trace.world_size))


def tensor_bytes(dims, types) -> float | None:
    """Bytes of an op's tensor arguments (scalars and non-tensors count nothing), None when a tensor's
    dtype is unknown or there are no tensors."""
    if dims is None or types is None or len(dims) != len(types):
        return None
    total, tensors = 0.0, 0
    for sizes, type_name in zip(dims, types):
        if not isinstance(sizes, (list, tuple)) or not sizes:
            continue  # a scalar or a non-tensor argument
        dtype = DTYPES.get(str(type_name).strip().lower())
        if dtype is None or not all(isinstance(s, int) and s >= 0 for s in sizes):
            return None
        total += math.prod(sizes) * DTYPE_BYTES[dtype]
        tensors += 1
    return total if tensors else None


def memory_samples(trace: Trace, samples: TraceSamples) -> None:
    """Elementwise kernels whose bytes follow from their op's tensors.

    The op's output is taken to be as large as its largest input (true of elementwise
    ops, broadcasting or not), so the kernel moves the inputs once and writes that much.
    Only ops that launched exactly one kernel count: an op that launched several shares
    its bytes among them in a way the trace does not record.
    """
    per_op = Counter(id(k.op) for k in trace.kernels if k.op is not None)
    for kernel in trace.kernels:
        if kernel.category != "elementwise":
            continue
        op = kernel.op
        if op is None or op.input_dims is None:
            samples.skipped["elementwise kernels whose op recorded no shapes"] += 1
            continue
        if per_op[id(op)] != 1:
            samples.skipped["elementwise kernels sharing their op with other kernels"] += 1
            continue
        inputs = tensor_bytes(op.input_dims, op.input_types)
        if inputs is None or kernel.duration_s <= 0:
            samples.skipped["elementwise kernels whose tensors cannot be sized"] += 1
            continue
        largest = max(math.prod(s) * DTYPE_BYTES[DTYPES[str(t).strip().lower()]]
                      for s, t in zip(op.input_dims, op.input_types) if isinstance(s, (list, tuple)) and s)
        samples.memory.append(MemorySample(op.name, inputs + largest, kernel.duration_s))


def launch_gaps(trace: Trace, samples: TraceSamples) -> None:
    """Gaps between consecutive kernels of each stream, sorted by whether the GPU waited for the CPU.

    When the next kernel's CPU op began only after the previous kernel had ended, the
    stream sat idle until the CPU launched it (``waiting``); when the op began before, the
    kernel was already queued and the gap is the device's own switch between kernels
    (``queued``). Collectives and copies are left out: their gaps wait for other ranks or
    the host, not for a launch. Overlapping kernels (gap below zero) count as no gap.
    """
    last: dict[int, Kernel] = {}
    for kernel in trace.kernels:
        if kernel.category in ("collective", "memcpy", "memset"):
            last.pop(kernel.stream, None)
            continue
        previous = last.get(kernel.stream)
        last[kernel.stream] = kernel
        if previous is None or kernel.op is None:
            continue
        gap_s = kernel.start_s - previous.end_s
        if gap_s < 0:
            continue
        if kernel.op.start_s >= previous.end_s:
            samples.waiting_gaps_s.append(gap_s)
        else:
            samples.queued_gaps_s.append(gap_s)


def trace_samples(traces: list[Trace]) -> TraceSamples:
    """Every usable sample of ``traces``."""
    samples = TraceSamples()
    peers = peer_waits(traces)
    samples.peer_waits_kept = dict(peers.kept)
    for number, trace in enumerate(traces):
        gemm_samples(trace, samples, beside_shares(trace.kernels))
        collective_samples(trace, samples, peers.of(number))
        memory_samples(trace, samples)
        launch_gaps(trace, samples)
        # inside the trace's annotated passes where it has them, for each kind of pass; else all
        everything, inside = launch_intervals_by_pass(trace), launch_intervals_by_pass(trace, within_passes=True)
        if inside[0] or not everything[0]:
            samples.forward_intervals_s += inside[0]
        else:
            samples.forward_intervals_s += everything[0]
            samples.forward_within_passes = False
        if inside[1] or not everything[1]:
            samples.backward_intervals_s += inside[1]
        else:
            samples.backward_intervals_s += everything[1]
            samples.backward_within_passes = False
    return samples
