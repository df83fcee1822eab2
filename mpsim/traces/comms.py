"""What an NCCL kernel moved: the collective, its message and its group, from the trace.

The kernel's name gives NCCL's algorithm and protocol (``ncclKernel_AllReduce_RING_LL_Sum_float``,
``ncclDevKernel_AllGather_RING_LL``) but names the NCCL primitive, not the collective the
program asked for: NCCL runs an all-to-all as grouped ``SendRecv``. So the collective's kind
is taken from the innermost enclosing op that names one (``record_param_comms``'
``Collective name``, a ``c10d::`` op, an ``nccl:`` annotation), else from the kernel's name.

Sizes, first source that has them (innermost first), only from sources of the same kind:

1. the kernel's own args or an enclosing ``record_param_comms``: ``In msg nelems``,
   ``Out msg nelems``, ``dtype``, ``Group size`` (recent PyTorch);
2. a ``c10d::`` op's ``Input Dims`` (its output and input tensors);
3. an ``nccl:`` annotation's ``Input Dims`` (its input tensor).

``message_bytes`` follows nccl-tests: all-reduce and broadcast the buffer, all-gather the
output (every rank's part), reduce-scatter the input, all-to-all the rank's send buffer,
send-recv what one rank sends. What the trace does not say stays None.

Recent PyTorch also names the group's ranks (``Process Group Ranks``), the group and the
collective's sequence number in it (``Seq``): what finds one collective on every rank
that took part (``peers.py``).
"""

from __future__ import annotations

import math
import re

from mpsim.traces.model import Collective
from mpsim.traces.shapes import DTYPE_BYTES, dtype_name

# NCCL primitive in a kernel name -> collective kind
_KERNEL_KINDS = {
    "allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
    "alltoall": "all-to-all", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send-recv",
    "send": "send-recv", "recv": "send-recv",
}
# a normalised op or collective name's prefix -> kind, in the order to try them
_OP_KINDS = (("allreduce", "all-reduce"), ("allgather", "all-gather"), ("reducescatter", "reduce-scatter"),
             ("alltoall", "all-to-all"), ("broadcast", "broadcast"), ("send", "send-recv"),
             ("recv", "send-recv"), ("reduce", "reduce"))
_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_ALGORITHM = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)(?=_|\(|$)")
_PROTOCOL = re.compile(r"_(LL128|LL|SIMPLE)(?=_|\(|$)")


def kernel_kind(kernel_name: str) -> str | None:
    """The collective an NCCL kernel's name names (None for a generic kernel)."""
    match = _KERNEL.match(kernel_name)
    return _KERNEL_KINDS.get(match.group(1).lower()) if match else None


def name_kind(name: str) -> str | None:
    """The collective a ``c10d::``/``nccl:`` op name or a ``Collective name`` value names."""
    bare = name.split(":")[-1].lower().replace("_", "")
    for prefix, kind in _OP_KINDS:
        if bare.startswith(prefix):
            return kind
    return None


def _event_kind(name: str, args: dict) -> str | None:
    if isinstance(args.get("Collective name"), str):
        return name_kind(args["Collective name"])
    if name.startswith(("c10d::", "nccl:")):
        return name_kind(name)
    return None


def _elements(dims) -> int | None:
    if not isinstance(dims, (list, tuple)) or not all(type(size) is int and size >= 0 for size in dims):
        return None
    return math.prod(dims)


def _from_counts(kind: str, args: dict) -> tuple[float | None, int | None, str | None]:
    """(message bytes, group size, dtype) from ``In/Out msg nelems``, ``dtype``, ``Group size``."""
    dtype = dtype_name(args.get("dtype")) if isinstance(args.get("dtype"), str) else None
    group = args.get("Group size")
    group = group if type(group) is int and group > 0 else None
    key = "Out msg nelems" if kind == "all-gather" else "In msg nelems"
    count = args.get(key)
    if type(count) is not int or count < 0 or dtype not in DTYPE_BYTES:
        return None, group, dtype
    return float(count * DTYPE_BYTES[dtype]), group, dtype


def _from_dims(kind: str, name: str, args: dict) -> tuple[float | None, int | None, str | None]:
    """(message bytes, group size, dtype) from a ``c10d::`` op's or ``nccl:`` annotation's tensors."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims:
        return None, None, None
    if name.startswith("c10d::") and kind in ("all-gather", "reduce-scatter", "all-to-all"):
        # the _base_ ops take (output, input); anything else (tensor lists) records no sizes
        if len(dims) < 2 or len(types) < 2:
            return None, None, None
        out_n, in_n = _elements(dims[0]), _elements(dims[1])
        dtype = dtype_name(types[1])
        if out_n is None or in_n is None or not in_n or not out_n or dtype not in DTYPE_BYTES:
            return None, None, None
        size = DTYPE_BYTES[dtype]
        if kind == "all-gather":
            return float(out_n * size), (out_n // in_n if out_n % in_n == 0 else None), dtype
        if kind == "reduce-scatter":
            return float(in_n * size), (in_n // out_n if in_n % out_n == 0 else None), dtype
        return float(in_n * size), None, dtype
    if name.startswith("nccl:") and len(dims) == 1:
        count, dtype = _elements(dims[0]), dtype_name(types[0])
        if count is None or dtype not in DTYPE_BYTES:
            return None, None, dtype
        # the annotation records the input; an all-gather's output needs the group size
        return (None if kind == "all-gather" else float(count * DTYPE_BYTES[dtype])), None, dtype
    return None, None, None


def _group_ranks(value) -> tuple[int, ...] | None:
    """``Process Group Ranks``: a list, or its text ``"[0, 1, 2, 3]"``; None when absent or
    truncated (``record_param_comms`` writes ``...`` past 30 ranks)."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")) or "..." in text:
            return None
        parts = [part.strip() for part in text[1:-1].split(",") if part.strip()]
        if not all(part.isdigit() for part in parts):
            return None
        value = [int(part) for part in parts]
    if isinstance(value, list) and value and all(type(rank) is int and rank >= 0 for rank in value):
        return tuple(value)
    return None


def _group_fields(sources: list[dict]) -> tuple[tuple[int, ...] | None, str | None, int | None]:
    """(group ranks, group name, sequence number), innermost source first."""
    ranks = name = seq = None
    for args in sources:
        ranks = ranks or _group_ranks(args.get("Process Group Ranks"))
        found = args.get("Process Group Name")
        name = name if name is not None else (str(found) if isinstance(found, (str, int)) else None)
        number = args.get("Seq")
        seq = seq if seq is not None else (number if type(number) is int and number >= 0 else None)
    return ranks, name, seq


def collective_of(kernel_name: str, kernel_args: dict, enclosing: list[tuple[str, dict]]) -> Collective:
    """The ``Collective`` of an NCCL kernel; ``enclosing`` is its enclosing ops' and
    annotations' ``(name, args)``, outermost first."""
    kind = None
    for name, args in reversed(enclosing):
        kind = _event_kind(name, args)
        if kind is not None:
            break
    kind = kind or _event_kind("", kernel_args) or kernel_kind(kernel_name) or "other"
    message_bytes: float | None = None
    group_size: int | None = None
    dtype: str | None = None
    for name, args in [("", kernel_args)] + list(reversed(enclosing)):
        source_kind = _event_kind(name, args)
        if source_kind is not None and source_kind != kind:
            continue
        if "In msg nelems" in args or "Out msg nelems" in args:
            found = _from_counts(kind, args)
        else:
            found = _from_dims(kind, name, args)
        message_bytes = message_bytes if message_bytes is not None else found[0]
        group_size = group_size if group_size is not None else found[1]
        dtype = dtype or found[2]
    algorithm = _ALGORITHM.search(kernel_name)
    protocol = _PROTOCOL.search(kernel_name)
    ranks, group_name, seq = _group_fields([kernel_args] + [args for _, args in reversed(enclosing)])
    if ranks is not None and group_size is not None and len(ranks) != group_size:
        ranks = None  # the two disagree: trust neither for matching ranks
    return Collective(kind=kind, message_bytes=message_bytes, group_size=group_size,
                      algorithm=algorithm.group(1) if algorithm else None,
                      protocol=protocol.group(1) if protocol else None, dtype=dtype,
                      group_ranks=ranks, group_name=group_name, seq=seq)
