"""A deduplicating MoE dispatch: one copy per node over the network, one per GPU over NVLink.

Megatron-Core's all-to-all dispatcher sends a token once for every expert it picks, each
copy straight to the expert's GPU (``nccl.pairwise_all_to_all``). DeepEP's normal kernels
(github.com/deepseek-ai/DeepEP; DeepSeek-V3 technical report, Sec. 3.2.2) send it once over
the network to each node holding one of its experts, to the GPU there with the sender's
local index, which forwards it over NVLink once to each GPU of that node holding its
experts; tokens for the sender's own node go over NVLink directly. The combine runs the
same paths back, and so do the two gradients. Both fabrics carry their share at once, so
the slower one sets the time.

How many nodes and GPUs a token reaches is the router's doing. Group-limited routing
(DeepSeek-V3: 256 experts in 8 groups, one per node, each token's 8 experts from 4 groups)
bounds the nodes; without it 8 experts over 8 nodes reach about 5.3 of them. The expected
counts come from the gate's own rule run on a sample of tokens with independent, identically
distributed affinities, the balanced load the router's balancing aims at
(:func:`token_spread`; a fixed seed, so the same inputs give the same numbers). The rule is
Megatron-Core's ``group_limited_topk``: a group scores the sum of its best ``top_k //
group_topk`` affinities, a token keeps its ``group_topk`` best groups, then its ``top_k``
best experts among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mpsim.cost.nccl import GpuGroup
from mpsim.workload.ops import Op, Routing

SAMPLE_TOKENS = 8192  # tokens the spread is averaged over (its sampling error is below 0.5 %)
SAMPLE_SEED = 0


@dataclass(frozen=True)
class Spread:
    """Copies of one token a deduplicating dispatcher sends, on average."""

    network: float  # to nodes other than the sender's
    nvlink: float  # inside nodes: to the sender's node's GPUs, and forwarded from where a copy lands


@lru_cache(maxsize=256)
def token_spread(routing: Routing, ranks: int, per_node: int) -> Spread:
    """Expected copies per token over the network and over NVLink for ``ranks`` expert-parallel
    ranks, ``per_node`` of them on each node, the experts split evenly over the ranks in order."""
    experts, top_k = routing.num_experts, routing.top_k
    rng = np.random.default_rng(SAMPLE_SEED)
    scores = rng.random((SAMPLE_TOKENS, experts))
    if routing.groups > 1:
        per_group = experts // routing.groups
        grouped = scores.reshape(SAMPLE_TOKENS, routing.groups, per_group)
        best = max(1, top_k // routing.group_topk)
        group_scores = np.sort(grouped, axis=-1)[:, :, -best:].sum(axis=-1)
        kept = np.argpartition(-group_scores, routing.group_topk - 1, axis=1)[:, :routing.group_topk]
        mask = np.zeros((SAMPLE_TOKENS, routing.groups), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=1)
        scores = np.where(np.repeat(mask, per_group, axis=1), scores, -1.0)
    chosen = np.argpartition(-scores, top_k - 1, axis=1)[:, :top_k]
    gpus = np.sort(chosen // (experts // ranks), axis=1)
    distinct = np.concatenate([np.ones((SAMPLE_TOKENS, 1), dtype=bool), np.diff(gpus, axis=1) > 0], axis=1)
    sender = rng.integers(0, ranks, SAMPLE_TOKENS)[:, None]
    target_node, sender_node = gpus // per_node, sender // per_node
    # a remote node's copy lands on the GPU with the sender's local index there
    landing = target_node * per_node + sender % per_node
    local = target_node == sender_node
    forwarded = distinct & np.where(local, gpus != sender, gpus != landing)
    nodes = np.sort(np.where(local, -1, target_node), axis=1)
    first_of_node = np.concatenate([nodes[:, :1] >= 0, (np.diff(nodes, axis=1) > 0) & (nodes[:, 1:] >= 0)], axis=1)
    return Spread(network=float(first_of_node.sum(axis=1).mean()), nvlink=float(forwarded.sum(axis=1).mean()))


def deduplicated_all_to_all_s(op: Op, group: GpuGroup) -> float:
    """Seconds of one dispatch or combine of ``op`` (its ``message_bytes``: one copy per token
    and expert, as the plain all-to-all would send) on ``group``."""
    assert op.routing is not None
    if group.size <= 1 or op.message_bytes <= 0:
        return 0.0  # every expert on this rank: nothing travels
    spread = token_spread(op.routing, group.size, group.per_node)
    per_copy = op.message_bytes / op.routing.top_k
    latency = group.base_latency_s + group.intra.step_latency_s + (group.inter.step_latency_s if group.nodes > 1
                                                                    else 0.0)
    # at the links' peak rates: the size curves of the system file are NCCL's (nccl-tests sweeps),
    # and DeepEP streams its copies in chunks of its own; its published runs moved 90-92 % of the
    # 48.5 GB/s this prices a CX7 at, where NCCL's all-reduce curve gives 76 % (a choice made
    # after reading them: docs/accuracy.md)
    return latency + max(spread.nvlink * per_copy / group.intra.bandwidth,
                         spread.network * per_copy / group.inter.bandwidth)
