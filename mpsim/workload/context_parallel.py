"""How the attention core reaches the keys and values of the whole sequence under context parallelism.

Each of the ``cp`` ranks holds ``s / cp`` tokens of every sequence (for a causal mask, two
chunks: chunk ``r`` and chunk ``2 cp - 1 - r``, so every rank has the same share of the
unmasked scores). Its queries attend over the whole sequence, which the keys and values
reach in one of three ways (``parallel.cp_comm``):

* ``ring`` (Megatron-Core's default, Transformer Engine's ``AttnFuncWithCPAndKVP2P``): K and
  V travel round the group in ``cp`` steps. The forward's step ``i`` runs attention on the
  block it holds while the next block is in flight; the backward's step ``i`` sends K, V and
  the dK, dV summed so far and waits for them before it adds its own. So each step is one
  piece of the core beside one transfer (``Overlap.piece_comm``), and a transfer longer than
  its piece shows past it. Around the steps Transformer Engine runs small kernels of its own
  (:func:`ring_bookkeeping`).
* ``all-gather`` (Llama 3): K and V all-gathered before the core, their gradients
  reduce-scattered after it.
* ``all-to-all`` (DeepSpeed Ulysses): the sequence split traded for a head split before the
  core and back after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.workload.blocks import LayerContext
from mpsim.workload.ops import Item, Op, Overlap, collective, memory_op

# Bytes per (token, head) of the softmax statistics Transformer Engine merges step by step: it
# keeps the running log-sum-exp in float64 (``softmax_lse.to(torch.double)``) and each step's
# in float32. A merge reads both and writes the running one (8 + 4 + 8); the output correction
# reads both (8 + 4); the copy into float64 before the first merge and back to float32 after the
# last each read one and write the other (4 + 8).
LSE_MERGE_BYTES = 20
LSE_READ_BYTES = 12
LSE_CONVERT_BYTES = 12


@dataclass(frozen=True)
class RingSizes:
    """Bytes one CP rank holds of the attention core's tensors for one microbatch."""

    q: float  # its queries
    out: float  # the core's output (and the output gradient arriving in the backward)
    kv: float  # its keys and values together
    stats: float  # (token, head) pairs of the softmax statistics: bytes per entry come from the constants above


def ring_sizes(ctx: LayerContext) -> RingSizes:
    """The sizes of :class:`RingSizes` for ``ctx``'s rank."""
    tokens, e = ctx.tokens, ctx.act_bytes
    heads = ctx.heads_local
    return RingSizes(q=float(tokens * heads * ctx.head_dim * e), out=float(tokens * heads * ctx.value_dim * e),
                     kv=float(tokens * ctx.kv_local * (ctx.head_dim + ctx.value_dim) * e),
                     stats=float(tokens * heads))


def _forward_bytes(sizes: RingSizes, cp: int, rank: int, causal: bool) -> tuple[float, int]:
    """(bytes, kernels) of Transformer Engine's own kernels around the ring's forward on CP rank ``rank``.

    Read from ``AttnFuncWithCPAndKVP2P.forward`` (TE 1.11 ``transformer_engine/pytorch/attention.py``,
    bf16 path): K and V packed into one send buffer (``torch.cat``); per step, the block the
    mask leaves is sliced into a contiguous copy (steps ``1..rank`` use the first half of the
    arriving K/V, the later ones only the second half of the queries); the softmax statistics
    merged step by step; the output zero-filled, then each step's partial output merged into it
    (``flash_attn_fwd_out_correction``: read both, write the sum; half of it where the step saw
    half of the queries).
    """
    q, out, kv, stats = sizes.q, sizes.out, sizes.kv, sizes.stats
    moved = 2 * kv + out + 2 * LSE_CONVERT_BYTES * stats  # pack K/V, zero the output, the statistics' copies
    kernels = 4
    for step in range(cp):
        half_queries = causal and step > rank
        if causal and step > 0:
            moved += q if half_queries else kv  # read half, write half
            kernels += 1
        share = 0.5 if half_queries else 1.0
        moved += share * (3 * out + LSE_READ_BYTES * stats)  # merge the step's output
        kernels += 1
        if step > 0:
            moved += share * LSE_MERGE_BYTES * stats
            kernels += 1
    return moved, kernels


def _backward_bytes(sizes: RingSizes, cp: int, rank: int, causal: bool) -> tuple[float, int]:
    """(bytes, kernels) of Transformer Engine's own kernels around the ring's backward on CP rank ``rank``.

    From ``AttnFuncWithCPAndKVP2P.backward`` (same source): K/V copied into the ring's send
    buffer; the steps run in reverse, the diagonal block last. A step on half the keys
    (``i >= cp - rank - 1``) slices them; one on half the queries slices the queries, the
    output and its gradient. Each step's dK and dV are packed into one tensor (``torch.cat``),
    and its dQ and dK/dV go into the running sums by a copy (read one, write one) where the
    code copies and an add (read both, write the sum) where it adds, on the halves it names.
    """
    q, out, kv = sizes.q, sizes.out, sizes.kv
    moved, kernels = 2 * kv, 1
    for step in range(cp):
        if not causal:
            moved += 2 * kv + (2 if step == 0 else 3) * (q + kv)
            kernels += 3
            continue
        diagonal, first_half_keys = step == cp - 1, step >= cp - rank - 1
        if diagonal:
            dkv = kv
        elif first_half_keys:
            moved += kv  # the first half of the arriving K/V, made contiguous
            kernels += 1
            dkv = kv / 2
        else:
            moved += q + 2 * out  # the second half of the queries, the output and its gradient
            kernels += 3
            dkv = kv
        moved += 2 * dkv  # dK and dV packed
        # dQ: a step past the rank's first full-query step adds to all of it; that first step
        # copies all of it (the last rank) or copies one half and adds the other; the
        # half-query steps before it copy (step 0) or add the second half
        if step > cp - rank - 1:
            moved += 3 * q
        elif step == cp - rank - 1:
            moved += 2 * q if rank == cp - 1 else 2.5 * q
        else:
            moved += 1.5 * q if step > 0 else q
        # dK/dV of the block passing through
        if diagonal:
            moved += 2.5 * kv if rank == 0 else 3 * kv
        elif first_half_keys:
            moved += kv if step == 0 and rank == cp - 1 else 1.5 * kv
        else:
            moved += 3 * kv if step > 0 else 2 * kv
        kernels += 3
    return moved, kernels


def ring_bookkeeping(ctx: LayerContext) -> tuple[Op, Op]:
    """(forward, backward) memory-bound kernels Transformer Engine's ring runs beside the core.

    The CP ranks meet at every step's transfer, so each pass goes at its slowest rank's pace:
    the rank whose steps move the most bytes.
    """
    sizes, cp, causal = ring_sizes(ctx), ctx.cp, ctx.causal
    forward = max(_forward_bytes(sizes, cp, rank, causal) for rank in range(cp))
    backward = max(_backward_bytes(sizes, cp, rank, causal) for rank in range(cp))
    return (memory_op("attn.cp_ring_merge", forward[0], launches=forward[1]),
            memory_op("attn.cp_ring_merge.grad", backward[0], launches=backward[1]))


def ring_step_shares(cp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(forward, backward) share of the ring's transfers beside each of its ``cp`` steps.

    Forward: steps ``0 .. cp - 2`` each send one K/V block on while they compute; the last sends
    nothing. Backward: the first step sends K/V, the middle ones K/V and dK/dV, the last dK/dV
    only, of ``2 (cp - 1)`` blocks in all.
    """
    forward = (1.0 / (cp - 1),) * (cp - 1) + (0.0,)
    blocks = 2.0 * (cp - 1)
    backward = (1.0 / blocks,) + (2.0 / blocks,) * (cp - 2) + (1.0 / blocks,)
    return forward, backward


def context_parallel(ctx: LayerContext, fwd: list[Item], bwd: list[Item]) -> tuple[list[Item], list[Item]]:
    """Wrap the attention core (``fwd``, ``bwd``) with the context-parallel work of ``ctx.cp_comm``."""
    if ctx.cp == 1:
        return fwd, bwd
    e, b, s = ctx.act_bytes, ctx.microbatch_size, ctx.seq_length
    kv_width = ctx.kv_local * (ctx.head_dim + ctx.value_dim)
    if ctx.cp_comm == "ring":
        block = b * (s // ctx.cp) * kv_width * e
        ring = collective("attn.cp_ring_kv", "send-recv", "cp", block)
        ring_grad = collective("attn.cp_ring_kv_and_grad", "send-recv", "cp", 2 * block)
        forward_shares, backward_shares = ring_step_shares(ctx.cp)
        merge, merge_grad = ring_bookkeeping(ctx)
        return ([Overlap(ring, tuple(fwd), piece_comm=forward_shares), merge],  # type: ignore[arg-type]
                [Overlap(ring_grad, tuple(bwd), piece_comm=backward_shares), merge_grad])  # type: ignore[arg-type]
    if ctx.cp_comm == "all-gather":
        gathered = b * s * kv_width * e
        return ([collective("attn.cp_all_gather_kv", "all-gather", "cp", gathered), *fwd],
                [collective("attn.cp_regather_kv", "all-gather", "cp", gathered), *bwd,
                 collective("attn.cp_reduce_scatter_dkv", "reduce-scatter", "cp", gathered)])
    # all-to-all (Ulysses): sequence-split QKV in, head-split out; the reverse after the core
    qkv = ctx.tokens * (ctx.heads_local * ctx.head_dim + kv_width) * e
    out = ctx.tokens * ctx.heads_local * ctx.value_dim * e
    return ([collective("attn.cp_all_to_all_qkv", "all-to-all", "cp", qkv), *fwd,
             collective("attn.cp_all_to_all_out", "all-to-all", "cp", out)],
            [collective("attn.cp_all_to_all_dout", "all-to-all", "cp", out), *bwd,
             collective("attn.cp_all_to_all_dqkv", "all-to-all", "cp", qkv)])
