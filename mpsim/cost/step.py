"""Per-step costs around the actions: gradient synchronization, optimizer, transfers.

Data-parallel gradient reduction depends on the ZeRO stage (Rajbhandari et al. 2020):

* 0: all-reduce of each stage's gradients, in buckets, during the last backward;
* 1 (Megatron's distributed optimizer): reduce-scatter instead, and an all-gather of the
  updated parameters after the optimizer step;
* 2: gradients are sharded, so each microbatch's gradients are reduce-scattered as its
  backward produces them (DeepSpeed ZeRO-2, FSDP SHARD_GRAD_OP); parameters all-gathered
  after the step;
* 3 (FSDP full shard): per-layer gathers and reduce-scatters are part of the actions
  (``actions.py``); nothing after the step.

With hybrid sharding the shards are also all-reduced across the replica groups at the
end. Expert gradients are reduced over the expert data-parallel group.

A layer block that several pipeline ranks hold (the bidirectional DualPipe keeps block
``k`` on ranks ``k`` and ``p-1-k``) must have its copies' gradients summed; as in
DeepSeek-V3, the data-parallel reduction does it: its group is the DP group of every
rank holding a copy (2 x DP ranks for DualPipe), so it moves the same bytes over a
group twice as large, which may span more nodes.
"""

from __future__ import annotations

import math

from mpsim.cost.actions import CostModel
from mpsim.cost.collectives import collective_time, p2p_time
from mpsim.cost.topology import GroupPlacement, pipeline_neighbours_share_node, place_ranks
from mpsim.workload.stage_work import StageWork, Workload

# Optimizer step per parameter. Adam (Megatron mixed precision): read the fp32 grad for the
# global norm used by clipping (4 B); read fp32 grad, master weight, m, v (16 B) and write
# master, m, v (12 B) in the fused Adam kernel; copy the master weight to the bf16 model
# weight (4 B read, 2 B written). Adam with bf16 state: read grad (4), bf16 m, v and weight
# (6), write them (6), norm read (2).
OPTIMIZER_STEP_BYTES_PER_PARAM = {"adam": 38, "adam-bf16": 18}
GRAD_ZERO_BYTES_PER_PARAM = 4

# (ready fraction of the action, seconds, label, group: a name, or the placement of a
# group joined over the ranks holding copies of a block)
Bucket = tuple[float, float, str, "str | GroupPlacement"]


def copies_placement(model: CostModel, group: str, copy_ranks: tuple[int, ...]) -> GroupPlacement:
    """``group`` on every pipeline rank in ``copy_ranks``, joined: the reduction of a block they all hold."""
    layout = model.layout
    base = model.placements[group].member_ranks(layout.devices_per_node)
    stride = layout.stride("pp")
    return place_ranks([rank + pp_rank * stride for pp_rank in copy_ranks for rank in base], layout.devices_per_node)


def _buckets(grad_bytes: float, kind: str, group: str, model: CostModel, label: str,
             copy_ranks: tuple[int, ...] = ()) -> tuple[Bucket, ...]:
    """Equal buckets of a gradient reduction, ready in backward order.

    ``copy_ranks``: the pipeline ranks holding a copy of the stage's block when there are
    several; the reduction then spans the group on all of them.
    """
    place = model.placements[group] if len(copy_ranks) < 2 else copies_placement(model, group, copy_ranks)
    if grad_bytes <= 0 or place.size <= 1:
        return ()
    count = max(1, math.ceil(grad_bytes / model.scenario.training.grad_reduce_bucket_bytes))
    seconds = collective_time(kind, grad_bytes / count, place, model.system)
    where = group if len(copy_ranks) < 2 else place
    return tuple(((i + 1) / count, seconds, f"{label} {i + 1}/{count}", where) for i in range(count))


def final_grad_buckets(work: StageWork, model: CostModel, copy_ranks: tuple[int, ...] = ()) -> tuple[Bucket, ...]:
    """Reductions launched during a stage's last backward (ZeRO 0/1; hybrid-shard replicas).

    ``copy_ranks``: pipeline ranks holding copies of the stage's block (DualPipe), whose
    gradients the DP reduction sums too.
    """
    layout = model.layout
    grad_bytes = 4 if model.scenario.training.fp32_grad_accumulation else 2
    dense = work.params * grad_bytes
    buckets: tuple[Bucket, ...] = ()
    if layout.zero_stage == 0:
        buckets += _buckets(dense, "all-reduce", "dp", model, "grad all-reduce", copy_ranks)
    elif layout.zero_stage == 1:
        buckets += _buckets(dense, "reduce-scatter", "zero", model, "grad reduce-scatter", copy_ranks)
    if layout.zero_stage >= 1:
        shard = dense / layout.zero_shard_size
        buckets += _buckets(shard, "all-reduce", "zero-replica", model, "grad shard all-reduce across replicas")
    expert_kind = "all-reduce" if layout.zero_stage == 0 else "reduce-scatter"
    buckets += _buckets(work.expert_params * grad_bytes, expert_kind, "edp", model, f"expert grad {expert_kind}",
                        copy_ranks)
    return buckets


def microbatch_grad_buckets(work: StageWork, model: CostModel, copy_ranks: tuple[int, ...] = ()
                            ) -> tuple[Bucket, ...]:
    """ZeRO-2: every backward of the stage reduce-scatters the gradients it produced."""
    if model.layout.zero_stage != 2:
        return ()
    grad_bytes = 4 if model.scenario.training.fp32_grad_accumulation else 2
    return _buckets(work.params * grad_bytes, "reduce-scatter", "zero", model, "ZeRO-2 grad reduce-scatter",
                    copy_ranks)


def optimizer_s(works: list[StageWork], model: CostModel) -> float:
    """Seconds of one rank's optimizer step (and the parameter all-gather when it is sharded)."""
    layout, training = model.layout, model.scenario.training
    dense = sum(w.params for w in works)
    experts = sum(w.expert_params for w in works)
    sharded = layout.zero_stage >= 1
    updated = dense / layout.zero_shard_size + experts / layout.expert_dp if sharded else dense + experts
    unsharded_grads = 0.0 if layout.zero_stage >= 2 else dense + experts
    seconds = (updated * OPTIMIZER_STEP_BYTES_PER_PARAM[training.optimizer]
               + unsharded_grads * GRAD_ZERO_BYTES_PER_PARAM) / model.compute.memory_bandwidth
    if layout.zero_stage in (1, 2):
        seconds += collective_time("all-gather", dense * 2, model.placements["zero"], model.system)
    if sharded and experts:
        seconds += collective_time("all-gather", experts * 2, model.placements["edp"], model.system)
    return seconds


def pipeline_transfer_s(workload: Workload, model: CostModel, rank_a: int, rank_b: int,
                        cut: int | None = None) -> float:
    """Seconds to send one microbatch's activation (or gradient) between two pipeline ranks
    across the cut after stage ``cut`` (None: the largest cut's size)."""
    if rank_a == rank_b:
        return 0.0
    same_node = pipeline_neighbours_share_node(model.layout, rank_a, rank_b)
    return p2p_time(workload.boundary_bytes(cut), same_node, model.system)


def pipeline_transfer_spec(workload: Workload, model: CostModel, rank_a: int, rank_b: int, cut: int | None = None
                           ) -> tuple[float, float, tuple]:
    """(latency, seconds on the wire alone, links) of a pipeline transfer, for contention.

    Inside a node it leaves through the sender's fabric port and enters the receiver's;
    across nodes through their NICs (each rank's share of its node's NICs).
    """
    total = pipeline_transfer_s(workload, model, rank_a, rank_b, cut)
    same_node = pipeline_neighbours_share_node(model.layout, rank_a, rank_b)
    latency = min(total, p2p_time(1.0, same_node, model.system))  # a one-byte message is all latency
    kind = "nvl" if same_node else "nic"
    return latency, total - latency, ((f"{kind}-out", rank_a), (f"{kind}-in", rank_b))


def group_links(model: CostModel, group: "str | GroupPlacement", rank: int) -> tuple:
    """Links a collective of ``group`` loads on ``rank``: its NIC both ways if the group spans nodes."""
    place = group if isinstance(group, GroupPlacement) else model.placements[group]
    kind = "nic" if place.nodes > 1 else "nvl"
    return ((f"{kind}-out", rank), (f"{kind}-in", rank))


def tied_embedding_sync_s(workload: Workload, model: CostModel, rank_a: int, rank_b: int) -> float:
    """Megatron all-reduces the tied embedding's fp32 gradient between first and last stage."""
    layout = model.layout
    place = place_ranks([rank_a * layout.stride("pp"), rank_b * layout.stride("pp")], layout.devices_per_node)
    grad_bytes = workload.vocab_padded // layout.tp * model.scenario.model.hidden_size * 4
    return collective_time("all-reduce", grad_bytes, place, model.system)
