"""Ops: the unit of work the cost model prices.

An :class:`Op` is one kernel (a GEMM, a fused attention kernel, a memory-bound
elementwise or norm kernel) or one collective on a named process group. A *pass* is the
ordered list of what one rank runs for a forward or backward piece of a layer; an
:class:`Overlap` inside a pass is a collective that runs on the communication stream
while the listed compute ops run (Megatron overlaps the input-gradient all-reduce with
the weight-gradient GEMM this way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

OpKind = Literal["gemm", "attention", "memory", "collective"]
CollectiveKind = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]


@dataclass(frozen=True)
class Routing:
    """How a MoE layer picks experts, for a dispatcher that sends each token once to every node
    and every GPU it reaches (DeepEP), not once per expert: ``top_k`` of ``num_experts``, from
    ``group_topk`` of the experts' ``groups`` (DeepSeek-V3's node-limited routing; 1 and 1:
    any expert). ``mpsim/cost/dispatch.py`` prices the traffic this leaves."""

    num_experts: int
    top_k: int
    groups: int = 1
    group_topk: int = 1


@dataclass(frozen=True)
class Op:
    """One kernel or one collective, with the work it does on one rank."""

    name: str
    kind: OpKind
    flops: float = 0.0
    bytes: float = 0.0  # HBM traffic: bytes read + written
    # GEMMs: (batch, m, n, k) of C[m, n] = A[m, k] @ B[k, n]
    shape: tuple[int, int, int, int] | None = None
    # the precision it runs in when that is not the run's compute dtype: an fp8 run keeps
    # attention and the LM head in bf16, as Transformer Engine does ("" = the run's dtype)
    dtype: str = ""
    # fp8 GEMMs: bytes the kernel before it moves to cast its bf16 operand to fp8 (and keep
    # a transposed copy for the weight gradient), priced as a memory-bound kernel of its own
    cast_bytes: float = 0.0
    # fp8 GEMMs: the kernels that cast takes (Transformer Engine's current scaling quantizes each
    # tensor in four: zero the amax, find it, compute the scale, cast and transpose)
    cast_launches: int = 1
    # GEMMs: ``batch`` GEMMs of their own, launched one by one round-robin over this many streams,
    # so that this many run at a time (Transformer Engine's GroupedLinear: one cuBLASLt GEMM per
    # local expert on 4 compute streams); 0: one kernel over the whole batch
    streams: int = 0
    # GEMMs: bytes per element of C the kernel's epilogue moves: written, plus read back when it
    # accumulates into an existing buffer (a weight gradient into fp32 main_grad); 0: one element
    # of the compute dtype
    epilogue_bytes: int = 0
    # attention kernels: "forward" or "backward"
    direction: str = ""
    # fused attention kernels: keys each query sees in one kernel call (the rate of a
    # published sweep is read at this length; 0: unknown) and the share of the op's FLOPs
    # that run under a causal mask (the rest attend to every key they are given)
    kernel_seq: int = 0
    causal_share: float = 0.0
    # fused attention kernels: keys per query of the unmasked calls where some rank's differ from
    # kernel_seq (a context-parallel ring's steps on half the keys); the pass goes at the slower
    # of the two (0: kernel_seq alone)
    unmasked_seq: int = 0
    # fused attention kernels: the query/key head size, which picks the kernel's tile shapes
    # (the rate of the sweep at that head dimension; 0: unknown, the sweep's own)
    head_dim: int = 0
    # collectives: what, over which group, payload as nccl-tests counts it
    collective: CollectiveKind | None = None
    group: str = ""
    message_bytes: float = 0.0
    # kernels the framework launches for it (its time covers them all, each with the part's
    # per-kernel overhead; the host pays each launch)
    launches: int = 1
    # memory-bound ops: the share of the accelerator's streaming rate the framework's kernels for
    # it reach, where a published sweep of those kernels measured it (benchmarks/memory_kernel_sweep.py);
    # 1: the streaming rate
    bandwidth_share: float = 1.0
    # MoE all-to-alls of a deduplicating dispatcher: the routing that decides which nodes and GPUs
    # each token reaches (message_bytes then counts one copy per token and expert, as the plain
    # all-to-all sends them); None: a plain all-to-all
    routing: Routing | None = None
    # the host waits for the GPU at this op (a device-to-host copy it reads): "end", before it
    # launches the next op, until this one has ended; "start", having launched this one, until
    # the GPU starts it (what it reads was copied just before). Either way the GPU's queue runs
    # dry there, and what follows runs at the host's pace until the host gets ahead again (a
    # dropless MoE dispatch, which must know how many tokens each rank receives:
    # mpsim/workload/moe.py); "": the host does not wait
    host_waits: Literal["", "start", "end"] = ""
    # replayed from a captured CUDA graph (mpsim/workload/graphs.py): "start", the first op of a
    # replay, for which the host launches the graph once; "in", launched with it; "": eagerly
    graph: Literal["", "start", "in"] = ""

    @property
    def host_launches(self) -> int:
        """Launches the host makes for it: its kernels and its fp8 cast's, or one graph replay."""
        if self.graph:
            return 1 if self.graph == "start" else 0
        return self.launches + (self.cast_launches if self.cast_bytes else 0)


@dataclass(frozen=True)
class Overlap:
    """A collective that runs concurrently with a run of compute ops.

    ``chunks == 1``: the two run side by side from the start (Megatron's overlap of an
    input-gradient collective with the weight-gradient GEMM, Transformer Engine's "bulk"
    overlaps). ``chunks > 1``: both are cut into pieces that form a two-stage pipeline
    (Transformer Engine's userbuffers): with ``comm_first`` the compute of piece i needs
    piece i of the collective, except the first, which the rank holds already (a ring
    exchange feeding an all-gather's GEMM); otherwise piece i of the collective needs piece
    i of the compute (a GEMM feeding a reduce-scatter). ``comm_sms``: the SMs the
    collective's kernels hold from the compute (None: the system's NCCL channels).

    ``piece_comm``: the compute cut into ``len(piece_comm)`` equal pieces run one after
    another, each side by side with its share of the collective, which it waits for before
    the next piece starts (context parallelism's ring: each step computes on one K/V block
    while the next is in flight). A share of 0 is a piece with nothing beside it.
    """

    comm: Op
    compute: tuple[Op, ...]
    chunks: int = 1
    comm_first: bool = False
    comm_sms: int | None = None
    piece_comm: tuple[float, ...] = ()


Item = Union[Op, Overlap]


@dataclass(frozen=True)
class Block:
    """A labelled run of items: one layer's forward, its recompute, the LM head's backward, ...

    With fully sharded parameters (ZeRO-3 / FSDP) a block first needs its parameters
    gathered (``gather``, prefetched while the previous block computes) and, after a
    backward, has its gradients reduce-scattered (``release``, on the data-parallel
    stream while later work goes on).
    """

    label: str  # "layer 3", "embedding", "lm head"
    category: str  # "forward", "backward", "recompute", "weight-grad"
    items: tuple[Item, ...]
    gather: Op | None = None
    release: Op | None = None


Pass = tuple[Block, ...]


def gemm(name: str, m: int, n: int, k: int, *, batch: int = 1, in_bytes: int = 2, out_bytes: int = 2,
         accumulate_bytes: int = 0, dtype: str = "", cast_bytes: float = 0.0) -> Op:
    """A (batched) GEMM C[m,n] = A[m,k] B[k,n]; ``accumulate_bytes`` adds a read-modify-write of C."""
    flops = 2.0 * batch * m * n * k
    traffic = batch * (in_bytes * (m * k + k * n) + out_bytes * m * n + 2 * accumulate_bytes * m * n)
    return Op(name, "gemm", flops=flops, bytes=float(traffic), shape=(batch, m, n, k), dtype=dtype,
              cast_bytes=float(cast_bytes), epilogue_bytes=out_bytes + 2 * accumulate_bytes)


def memory_op(name: str, bytes_moved: float, flops: float = 0.0, launches: int = 1,
              bandwidth_share: float = 1.0) -> Op:
    """A bandwidth-bound kernel (norm, activation, dropout, softmax, optimizer), or ``launches``
    of them one after another that together move ``bytes_moved`` at ``bandwidth_share`` of the
    streaming rate."""
    return Op(name, "memory", flops=flops, bytes=float(bytes_moved), launches=launches,
              bandwidth_share=bandwidth_share)


def collective(name: str, kind: CollectiveKind, group: str, message_bytes: float,
               routing: Routing | None = None) -> Op:
    """A collective over ``group``; ``message_bytes`` is the buffer size nccl-tests would report
    (``routing``: a MoE all-to-all that sends each token once per node and GPU it reaches)."""
    return Op(name, "collective", collective=kind, group=group, message_bytes=float(message_bytes),
              routing=routing)


def compute_ops(items: list[Item] | tuple[Item, ...]) -> list[Op]:
    """Every compute (non-collective) op in a pass, in order."""
    found: list[Op] = []
    for item in items:
        if isinstance(item, Overlap):
            found.extend(item.compute)
        elif item.kind != "collective":
            found.append(item)
    return found


