"""What a PyTorch profiler trace says about one rank's GPU, as plain data.

A Kineto trace (``torch.profiler`` exported as Chrome trace-event JSON) records every GPU
kernel with its stream and its start and duration, every CPU op with the tensor shapes
it was called with (when the run recorded shapes), the CUDA runtime call that launched
each kernel, and the user's ``record_function`` annotations. The reader
(``mpsim/traces/read.py``) turns one file into a ``Trace``: the kernels in start order,
each linked to the CPU op that launched it, put in a category, and, for GEMMs and NCCL
collectives, given the shape or the message that prices it.

Times are seconds from the start of the trace (SI inside the code; Kineto writes
microseconds). Everything here is frozen: a trace is read once and never edited.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Kernel categories, in the order reports list them. ``collective`` kernels carry a
# ``Collective``; ``gemm`` kernels a ``Gemm`` when the launching op recorded its shapes.
CATEGORIES = ("gemm", "attention", "convolution", "elementwise", "collective", "memcpy", "memset", "other")


@dataclass(frozen=True)
class CpuOp:
    """A CPU op (``cat: cpu_op``) or user annotation that encloses a kernel's launch."""

    name: str
    start_s: float
    duration_s: float
    thread: int
    input_dims: tuple | None = None  # Kineto's ``Input Dims``: one list of sizes per input
    input_types: tuple | None = None  # Kineto's ``Input type``: one dtype name per input


@dataclass(frozen=True)
class Gemm:
    """One matrix product C[m, n] = A[m, k] B[k, n], ``batch`` of them, as the launching op called it."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str  # math mode the kernel ran: fp32, tf32, bf16, fp16 or fp8
    op: str  # the aten op that called it (aten::mm, aten::addmm, aten::bmm, ...)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class Collective:
    """One NCCL kernel's collective: what it moved and among how many ranks."""

    kind: str  # all-reduce, all-gather, reduce-scatter, all-to-all, send-recv, broadcast, reduce
    message_bytes: float | None  # the per-rank buffer nccl-tests calls the size; None when the trace lacks it
    group_size: int | None  # ranks in the process group; None when the trace lacks it
    algorithm: str | None  # RING, TREE, ... from the kernel name
    protocol: str | None  # LL, LL128, SIMPLE from the kernel name
    dtype: str | None = None
    # who took part, as recent PyTorch records it (``Process Group Ranks``; None when absent or
    # truncated), the group's name and the collective's sequence number in it (``Seq``)
    group_ranks: tuple[int, ...] | None = None
    group_name: str | None = None
    seq: int | None = None


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel (or memcpy / memset) as it ran."""

    name: str
    category: str  # one of CATEGORIES
    start_s: float
    duration_s: float
    stream: int
    correlation: int | None
    op: CpuOp | None = None  # innermost CPU op enclosing the launch; None when the trace cannot link it
    op_names: tuple[str, ...] = ()  # every enclosing CPU op and annotation, outermost first
    step: int | None = None  # the ``ProfilerStep#N`` the launch fell in
    gemm: Gemm | None = None
    collective: Collective | None = None
    launch_s: float | None = None  # when the CUDA runtime call that launched it began on the CPU
    launch_thread: int | None = None  # the CPU thread that launched it

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class Step:
    """A ``ProfilerStep#N`` range on the CPU thread that drove the training loop."""

    number: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Trace:
    """One rank's trace."""

    source: str  # the file it was read from, as the user named it
    device_name: str | None  # ``deviceProperties[].name`` (what torch.cuda.get_device_name says)
    device_sms: int | None
    device_memory_bytes: int | None
    compute_capability: tuple[int, int] | None
    rank: int | None  # ``distributedInfo``
    world_size: int | None
    kernels: tuple[Kernel, ...]  # in start order
    steps: tuple[Step, ...] = ()
    annotations: tuple[CpuOp, ...] = field(default=())  # user annotations (record_function), in start order
    # the trace's time zero on the host's clock, in microseconds (Kineto's ``ts`` of the earliest
    # event, plus ``baseTimeNanoseconds`` where the file has one): times of two ranks recorded on
    # one host's clock compare after shifting by the difference (``peers.py``)
    origin_us: float | None = None
