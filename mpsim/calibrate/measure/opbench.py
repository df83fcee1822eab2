"""PyTorch stand-ins for mpsim's compute ops, and their microbenchmarks.

Each op record (``mpsim/calibrate/measure/ops.py``) becomes a zero-argument callable that runs
what a PyTorch training step runs for it:

* GEMMs in the operand layout of ``nn.Linear`` (forward ``x W^T + b``, input gradient
  ``dY W``, weight gradient ``dY^T x``) or as a batched ``bmm``;
* the attention core through :func:`mpsim.calibrate.measure.torch_model.attention_core` (head
  split, SDPA or the unfused path, head merge), forward, or backward through autograd;
* memory-bound ops by their mpsim name: norms, residual adds, activations, softmax,
  dropout, embedding lookups and their gradients, cross entropy; a name without a
  stand-in streams the same bytes through a copy.

Backward stand-ins run ``torch.autograd.grad`` on a graph built once with
``retain_graph``, so only the backward kernels are timed.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from mpsim.calibrate.measure.timing import Measurement, measure
from mpsim.calibrate.measure.torch_model import TORCH_DTYPES, attention_core, causal_mask


def _randn(*shape, dtype, device, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


def _backward_of(out: torch.Tensor, inputs: list[torch.Tensor]) -> Callable[[], object]:
    """Time the backward of ``out`` with respect to ``inputs`` (graph kept between calls)."""
    grad = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)


def gemm_callable(record: dict, dtype, device) -> Callable[[], object]:
    batch, m, n, k = record["shape"]
    layout = record["layout"]
    if layout == "batched" or batch > 1:
        a, b = _randn(batch, m, k, dtype=dtype, device=device), _randn(batch, k, n, dtype=dtype, device=device)
        return lambda: torch.bmm(a, b)
    if layout == "dgrad":  # C[m, n] = dY[m, k] W[k, n], W stored [out = k, in = n]
        dy, w = _randn(m, k, dtype=dtype, device=device), _randn(k, n, dtype=dtype, device=device)
        return lambda: torch.mm(dy, w)
    if layout == "wgrad":  # C[m, n] (in x out) as dY^T x: dY [tokens = k, out = n], x [k, in = m]
        dy, x = _randn(k, n, dtype=dtype, device=device), _randn(k, m, dtype=dtype, device=device)
        return lambda: torch.mm(dy.t(), x)
    context = record.get("context") or {}
    x, w = _randn(m, k, dtype=dtype, device=device), _randn(n, k, dtype=dtype, device=device)
    bias = _randn(n, dtype=dtype, device=device) if context.get("bias") and not record["name"].startswith("head.") \
        else None
    return lambda: F.linear(x, w, bias)


def attention_callable(record: dict, dtype, device, fused: bool = True) -> Callable[[], object]:
    c = record["context"]
    qkv = _randn(c["batch"], c["seq"], 3 * c["heads_local"] * c["head_dim"], dtype=dtype, device=device,
                 grad=record["direction"] == "backward")
    mask = causal_mask(c["seq"], device)
    if record["direction"] == "forward":
        return lambda: attention_core(qkv, c["heads_local"], fused, mask)
    return _backward_of(attention_core(qkv, c["heads_local"], fused, mask), [qkv])


def _norm(c: dict, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if c["norm"] == "rmsnorm":
        return F.rms_norm(x, (x.shape[-1],), weight)
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def memory_callable(record: dict, dtype, device) -> Callable[[], object]:  # noqa: C901 - one table of cases
    """The PyTorch kernels behind an mpsim memory-bound op, by its name."""
    name, c = record["name"], record.get("context") or {}
    backward = name.endswith(".grad")
    base = name.removesuffix(".grad")
    leaf = base.rsplit(".", 1)[-1]

    def t(*shape, grad=False):
        return _randn(*shape, dtype=dtype, device=device, grad=grad)

    if c and leaf == "norm":
        x, weight, bias = t(c["norm_tokens"], c["hidden"], grad=True), t(c["hidden"], grad=True), t(c["hidden"],
                                                                                                    grad=True)
        if backward:
            return _backward_of(_norm(c, x, weight, bias), [x, weight, bias])
        return lambda: _norm(c, x, weight, bias)
    if c and leaf == "bda":  # residual add (dropout and bias are fused away at p = 0)
        a, b = t(c["norm_tokens"], c["hidden"]), t(c["norm_tokens"], c["hidden"])
        if c["dropout"] > 0 and not backward:
            return lambda: a + F.dropout(b, c["dropout"], training=True)
        return lambda: a + b  # backward: the residual's two gradients meet in one add
    if c and leaf == "act":
        if c["gated"]:
            gate, up = t(c["tokens"], c["ffn_local"], grad=True), t(c["tokens"], c["ffn_local"], grad=True)
            out = F.silu(gate) * up
            return _backward_of(out, [gate, up]) if backward else (lambda: F.silu(gate) * up)
        x = t(c["tokens"], c["ffn_local"], grad=True)
        return _backward_of(F.gelu(x), [x]) if backward else (lambda: F.gelu(x))
    if c and base == "attn.softmax":
        scores = t(c["batch"] * c["heads_local"], c["seq"], c["seq"], grad=True)
        mask = causal_mask(c["seq"], device)
        if backward:
            return _backward_of(torch.softmax(scores.masked_fill(mask, float("-inf")), -1), [scores])
        return lambda: torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
    if c and base == "attn.rope":
        x = t(c["tokens"], c["heads_local"] + c["kv_local"], c["head_dim"])
        cos, sin = t(c["tokens"], 1, c["head_dim"]), t(c["tokens"], 1, c["head_dim"])
        half = c["head_dim"] // 2
        return lambda: x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin
    if c and leaf == "dropout":
        shape = ((c["batch"] * c["heads_local"], c["seq"], c["seq"]) if base.startswith("attn.")
                 else (c["norm_tokens"], c["hidden"]))
        x = t(*shape)
        return lambda: F.dropout(x, max(c["dropout"], 0.1), training=True)
    if c and base in ("embedding.lookup", "embedding.positions"):
        rows = c["vocab_local"] if base == "embedding.lookup" else c["seq"]
        table = t(rows, c["hidden"])
        if base == "embedding.lookup":
            ids = torch.randint(0, rows, (c["tokens"],), device=device)
            return lambda: F.embedding(ids, table)
        tokens = t(c["batch"], c["seq"], c["hidden"])
        positions = torch.arange(c["seq"], device=device)
        return lambda: tokens + F.embedding(positions, table)
    if c and base in ("embedding.wgrad", "embedding.positions.wgrad"):
        rows = c["vocab_local"] if base == "embedding.wgrad" else c["seq"]
        ids = (torch.randint(0, rows, (c["tokens"],), device=device) if base == "embedding.wgrad"
               else torch.arange(c["seq"], device=device).repeat(c["batch"]))
        grad = t(c["tokens"], c["hidden"])
        return lambda: torch.ops.aten.embedding_dense_backward(grad, ids, rows, -1, False)
    if c and base == "head.cross_entropy":
        logits = t(c["tokens"], c["vocab_local"], grad=True)
        targets = torch.randint(0, c["vocab_local"], (c["tokens"],), device=device)
        if backward:
            return _backward_of(F.cross_entropy(logits, targets), [logits])
        return lambda: F.cross_entropy(logits, targets)
    # no stand-in: stream the op's bytes (half read, half written)
    element = torch.tensor([], dtype=dtype).element_size()
    count = max(1, int(record["bytes"] / (2 * element)))
    src, dst = t(count), t(count)
    return lambda: dst.copy_(src)


def op_callable(record: dict, device: torch.device) -> Callable[[], object]:
    """A zero-argument callable that runs the op once."""
    context = record.get("context") or {}
    dtype = TORCH_DTYPES.get(context.get("dtype", "fp32"), torch.float32)
    if record["kind"] == "gemm":
        return gemm_callable(record, dtype, device)
    if record["kind"] == "attention":
        return attention_callable(record, dtype, device, fused=record.get("fused", True))
    return memory_callable(record, dtype, device)


def bench_op(record: dict, device: torch.device, kind: str, budget_s: float = 0.12) -> Measurement:
    """Median seconds of one op record on ``device`` ("cpu" or "cuda" as ``kind``), about ``budget_s`` of repeats."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(1234)  # the same operands on every rank and every run
    fn = op_callable(record, device)
    torch.random.set_rng_state(generator_state)
    return measure(fn, kind, min_repeats=3, budget_s=budget_s)
