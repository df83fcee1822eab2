"""A matrix product's shape and math mode from the op that launched it.

Kineto records, for each CPU op when the run recorded shapes, ``Input Dims`` (one list of
sizes per argument, ``[]`` for a scalar or a non-tensor) and ``Input type``. The aten
matrix-product ops place their operands in fixed positions, so the shape follows:

==============  ===============================  =====================
op              operands                         product
==============  ===============================  =====================
aten::mm        [M,K], [K,N]                     M x K by K x N
aten::addmm     bias, [M,K], [K,N]               M x K by K x N
aten::bmm       [B,M,K], [B,K,N]                 B of them
aten::baddbmm   bias, [B,M,K], [B,K,N]           B of them
aten::matmul    [...,M,K], [K,N] or [B,M,K] x2   rows folded, or batched
aten::linear    [...,K], weight [N,K], bias      rows folded into M
==============  ===============================  =====================

The math mode comes from the kernel's name where it says (cutlass ``s1688gemm`` runs fp32
inputs on TF32 tensor cores; ``sgemm`` is plain fp32), else from the inputs' dtype.
"""

from __future__ import annotations

import math
import re

from mpsim.traces.model import CpuOp, Gemm

# Kineto's ``Input type`` strings -> the project's dtype names.
DTYPES = {
    "float": "fp32", "c10::half": "fp16", "half": "fp16", "c10::bfloat16": "bf16", "bfloat16": "bf16",
    "double": "fp64", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8", "signed char": "int8", "unsigned char": "uint8", "int": "int32",
    "long int": "int64", "int64_t": "int64", "bool": "bool",
    # record_param_comms and NCCL's own spellings (``dtype``: "Float", "BFloat16", ...)
    "byte": "uint8", "char": "int8", "short": "int16", "long": "int64", "float8_e4m3fn_": "fp8",
}
DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "uint8": 1,
               "int16": 2, "int32": 4, "int64": 8, "bool": 1}

# Kernel-name fragments that fix the math mode, checked in order (bf16 before f16: the
# string "bf16" contains "f16").
_NAME_MODES = (
    (re.compile(r"bf16|bfloat16", re.IGNORECASE), "bf16"),
    (re.compile(r"tf32|s1688gemm|s1688|s16816tf32", re.IGNORECASE), "tf32"),
    (re.compile(r"e4m3|e5m2|fp8", re.IGNORECASE), "fp8"),
    (re.compile(r"h1688|h16816|f16|fp16|hgemm|half", re.IGNORECASE), "fp16"),
    (re.compile(r"sgemm|simt_s", re.IGNORECASE), "fp32"),
)


def dtype_name(text: object) -> str | None:
    """The project's name for a dtype as Kineto or c10d writes it (None when unknown)."""
    if not isinstance(text, str):
        return None
    return DTYPES.get(text.strip().lower())


def math_mode(kernel_name: str, input_dtype: str | None) -> str | None:
    """The math mode a GEMM kernel ran: what its name says, else its inputs' dtype."""
    for pattern, mode in _NAME_MODES:
        if pattern.search(kernel_name):
            return mode
    return input_dtype


def _sizes(dims) -> list[int] | None:
    if not isinstance(dims, (list, tuple)) or not all(type(size) is int and size > 0 for size in dims):
        return None
    return list(dims)


def _product(op: str, dims: list, first: int) -> tuple[int, int, int, int] | None:
    """``(batch, m, n, k)`` of the two operands at ``dims[first]`` and ``dims[first + 1]``."""
    if len(dims) < first + 2:
        return None
    a, b = _sizes(dims[first]), _sizes(dims[first + 1])
    if not a or not b:
        return None
    if op in ("aten::mm", "aten::addmm") and len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 1, a[0], b[1], a[1]
    if op in ("aten::bmm", "aten::baddbmm") and len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return a[0], a[1], b[2], a[2]
    if op == "aten::matmul":
        if len(a) >= 2 and len(b) == 2 and a[-1] == b[0]:
            return 1, math.prod(a[:-1]), b[1], a[-1]
        if len(a) == len(b) >= 3 and a[:-2] == b[:-2] and a[-1] == b[-2]:
            return math.prod(a[:-2]), a[-2], b[-1], a[-1]
    return None


def _linear(dims: list) -> tuple[int, int, int, int] | None:
    if len(dims) < 2:
        return None
    x, weight = _sizes(dims[0]), _sizes(dims[1])
    if not x or not weight or len(weight) != 2 or x[-1] != weight[1]:
        return None
    return 1, math.prod(x[:-1]), weight[0], weight[1]


# op name -> index of the first matrix operand in ``Input Dims``
_OPERANDS = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1, "aten::matmul": 0}


def op_shape(op: CpuOp) -> tuple[int, int, int, int] | None:
    """``(batch, m, n, k)`` of a matrix-product op's call, or None when it is not one of
    the ops above or its ``Input Dims`` do not fit it."""
    if op.input_dims is None:
        return None
    dims = list(op.input_dims)
    if op.name == "aten::linear":
        return _linear(dims)
    if op.name in _OPERANDS:
        return _product(op.name, dims, _OPERANDS[op.name])
    return None


def gemm_of(kernel_name: str, ops: tuple[CpuOp, ...]) -> Gemm | None:
    """The ``Gemm`` a matrix-product kernel computed: the innermost of its enclosing ``ops``
    (outermost first) whose shapes parse, or None when none does."""
    for op in reversed(ops):
        shape = op_shape(op)
        if shape is None:
            continue
        batch, m, n, k = shape
        first = _OPERANDS.get(op.name, 0)
        types = op.input_types or ()
        input_dtype = dtype_name(types[first]) if len(types) > first else None
        mode = math_mode(kernel_name, input_dtype)
        if mode is None:
            return None
        return Gemm(batch=batch, m=m, n=n, k=k, dtype=mode, op=op.name)
    return None
