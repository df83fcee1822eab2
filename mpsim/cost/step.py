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
end. Expert gradients are reduced over the expert data-parallel group. A ZeRO shard
spans the data-parallel ranks times the context-parallel ranks (``Layout.shard_ranks``:
Megatron-Core's distributed optimizer shards over the DP x CP group), in memory, in the
optimizer step and in the collectives alike.

Buckets follow Megatron-Core: ``max(40M, 1M x DP x CP)`` parameters each, filled in
backward order (the last layers' gradients first), and only the first model chunk of
pipeline rank 0 is split into buckets; every other chunk reduces as one bucket, since
its reduction is off the critical path (``megatron/training/training.py``:
``resolve_ddp_bucket_size``, ``per_chunk_disable_bucketing``;
``megatron/core/distributed/param_and_grad_buffer.py``: parameters laid out in reverse).

With ``training.overlap_param_gather`` the distributed optimizer's parameter all-gather
leaves the optimizer step for the next step's forward (``param_gather_exposed_s``).

A layer block that several pipeline ranks hold (the bidirectional DualPipe keeps block
``k`` on ranks ``k`` and ``p-1-k``) must have its copies' gradients summed; as in
DeepSeek-V3, the data-parallel reduction does it: its group is the DP group of every
rank holding a copy (2 x DP ranks for DualPipe), so it moves the same bytes over a
group twice as large, which may span more nodes.
"""

from __future__ import annotations

from mpsim.cost.actions import CostModel
from mpsim.errors import InputError
from mpsim.units import format_bytes
from mpsim.cost.collectives import collective_time, p2p_time
from mpsim.cost.contention import end_beside
from mpsim.cost.topology import GroupPlacement, pipeline_neighbours_share_node, pipeline_pair, place_ranks
from mpsim.workload.stage_work import StageWork, Workload

# Optimizer step per parameter. Adam (Megatron mixed precision): read the fp32 grad for the
# global norm used by clipping (4 B); read fp32 grad, master weight, m, v (16 B) and write
# master, m, v (12 B) in the fused Adam kernel; copy the master weight to the bf16 model
# weight (4 B read, 2 B written). Adam with bf16 state: read grad (4), bf16 m, v and weight
# (6), write them (6), norm read (2).
OPTIMIZER_STEP_BYTES_PER_PARAM = {"adam": 38, "adam-bf16": 18}
GRAD_ZERO_BYTES_PER_PARAM = 4
# the gradient norm (and the fp16 found-inf flag) all-reduced as one fp32 number
GRAD_STAT_BYTES = 4.0
# fp16 loss scaling: torch._amp_foreach_non_finite_check_and_unscale_ reads and writes every fp32
# main gradient the rank owns (Megatron's MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan)
UNSCALE_BYTES_PER_PARAM = 8

# (ready fraction of the action, seconds, label, group: a name, or the placement of a
# group joined over the ranks holding copies of a block)
Bucket = tuple[float, float, str, "str | GroupPlacement"]


def copies_placement(model: CostModel, group: str, copy_ranks: tuple[int, ...]) -> GroupPlacement:
    """``group`` on every pipeline rank in ``copy_ranks``, joined: the reduction of a block they all hold."""
    layout = model.layout
    base = model.placements[group].member_ranks(layout.devices_per_node)
    stride = layout.stride("pp")
    return place_ranks([rank + pp_rank * stride for pp_rank in copy_ranks for rank in base], layout.devices_per_node)


# Megatron-Core's default bucket: max(40M, 1M x data-parallel size) parameters, the size taken
# over the DP x CP group (resolve_ddp_bucket_size, megatron/training/training.py; the field's
# doc in megatron/core/distributed/distributed_data_parallel_config.py)
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000
PARAM_GATHER_BYTES = 2  # the bf16 model weights the distributed optimizer all-gathers
# Transformer Engine's fp8 model parameters (NeMo fp8_params, Megatron-Core --fp8-param-gather):
# the optimizer casts its fp32 master shard to fp8 and the all-gather moves 1 byte per parameter
FP8_PARAM_GATHER_BYTES = 1
# Each bucket is one collective on the DP stream; far more than any framework makes (a 1T
# model in 25 MB buckets is about 160,000 per step over all stages, a few thousand per rank)
MAX_BUCKETS = 100_000


def bucket_params(model: CostModel) -> float:
    """Parameters per gradient bucket: ``training.grad_reduce_bucket_bytes`` or Megatron-Core's default."""
    given = model.scenario.training.grad_reduce_bucket_bytes
    if given is not None:
        return given / model.scenario.training.grad_bytes
    layout = model.layout
    return float(max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_DP_RANK * layout.dp * layout.cp))


def bucket_sizes(params: float, model: CostModel, bucketed: bool = True) -> tuple[float, ...]:
    """Parameters of each bucket in the order the backward fills them: full buckets, then the rest.

    Megatron-Core closes a bucket once it holds the bucket size (parameters in reverse
    order, so the last layers' bucket is first); ``bucketed`` False is one bucket.
    """
    if params <= 0:
        return ()
    size = bucket_params(model)
    if not bucketed or params <= size:
        return (params,)
    if params / size > MAX_BUCKETS:
        grad_bytes = model.scenario.training.grad_bytes
        raise InputError(f"{format_bytes(size * grad_bytes)} buckets make {params / size:.3g} gradient buckets per "
                         f"step, more than the {MAX_BUCKETS:,} mpsim prices; use a bucket of at least "
                         f"{format_bytes(params * grad_bytes / MAX_BUCKETS)} (frameworks use 25-200 MB)",
                         field="training.grad_reduce_bucket_bytes")
    full = int(params // size)
    rest = params - full * size
    return (size,) * full + ((rest,) if rest > 0 else ())


def _buckets(grad_bytes: float, kind: str, group: str, model: CostModel, label: str,
             copy_ranks: tuple[int, ...] = (), bucketed: bool = True, bytes_per_param: float = 0.0,
             units: int = 0) -> tuple[Bucket, ...]:
    """Buckets of a gradient reduction, ready in backward order.

    ``copy_ranks``: the pipeline ranks holding a copy of the stage's block when there are
    several; the reduction then spans the group on all of them. ``bytes_per_param``: bytes
    each parameter of a bucket adds to this reduction (a gradient, or its shard).
    ``units``: that many equal buckets instead of the bucket size (one per layer).
    """
    place = model.placements[group] if len(copy_ranks) < 2 else copies_placement(model, group, copy_ranks)
    if grad_bytes <= 0 or place.size <= 1:
        return ()
    per_param = bytes_per_param or model.scenario.training.grad_bytes
    params = grad_bytes / per_param
    sizes = (params / units,) * units if units else bucket_sizes(params, model, bucketed)
    total = sum(sizes)
    count = len(sizes)
    where = group if len(copy_ranks) < 2 else place
    buckets: list[Bucket] = []
    done = 0.0
    for i, params in enumerate(sizes):
        done += params
        seconds = collective_time(kind, params * per_param, place, model.system)
        buckets.append((done / total, seconds, f"{label} {i + 1}/{count}", where))
    return tuple(buckets)


def final_grad_buckets(work: StageWork, model: CostModel, copy_ranks: tuple[int, ...] = (), bucketed: bool = True
                       ) -> tuple[Bucket, ...]:
    """Reductions launched during a stage's last backward (ZeRO 0/1; hybrid-shard replicas).

    ``copy_ranks``: pipeline ranks holding copies of the stage's block (DualPipe), whose
    gradients the DP reduction sums too. ``bucketed``: split into Megatron-Core's buckets
    (pipeline rank 0's first chunk), else one bucket.
    """
    layout = model.layout
    grad_bytes = model.scenario.training.grad_bytes
    dense = work.params * grad_bytes
    buckets: tuple[Bucket, ...] = ()
    if layout.zero_stage == 0:
        buckets += _buckets(dense, "all-reduce", "dp", model, "grad all-reduce", copy_ranks, bucketed)
    elif layout.fsdp_pipelined:
        # FSDP reduce-scatters each unit (a layer) as the chunk's last backward finishes it
        buckets += _buckets(dense, "reduce-scatter", "zero", model, "FSDP grad reduce-scatter", copy_ranks,
                            units=max(1, work.layers))
    elif layout.zero_stage == 1:
        buckets += _buckets(dense, "reduce-scatter", "zero", model, "grad reduce-scatter", copy_ranks, bucketed)
    if layout.zero_stage >= 1:
        # each bucket's shard (1/shard_ranks of it) is all-reduced across the replica groups
        shard = dense / layout.shard_ranks
        buckets += _buckets(shard, "all-reduce", "zero-replica", model, "grad shard all-reduce across replicas",
                            bucketed=bucketed, bytes_per_param=grad_bytes / layout.shard_ranks)
    expert_kind = "all-reduce" if layout.zero_stage == 0 else "reduce-scatter"
    buckets += _buckets(work.expert_params * grad_bytes, expert_kind, "edp", model, f"expert grad {expert_kind}",
                        copy_ranks, bucketed)
    return buckets


def microbatch_grad_buckets(work: StageWork, model: CostModel, copy_ranks: tuple[int, ...] = ()
                            ) -> tuple[Bucket, ...]:
    """ZeRO-2: every backward of the stage reduce-scatters the gradients it produced.

    Sharded gradients are FSDP's SHARD_GRAD_OP (FSDP2 without ``reshard_after_forward``),
    which reduce-scatters each wrapped unit's gradients when its backward produces them:
    one bucket per layer, unless ``training.grad_reduce_bucket_bytes`` sets a size.
    """
    if model.layout.zero_stage != 2:
        return ()
    per_layer = model.scenario.training.grad_reduce_bucket_bytes is None
    return _buckets(work.params * model.scenario.training.grad_bytes, "reduce-scatter", "zero", model,
                    "ZeRO-2 grad reduce-scatter", copy_ranks, units=max(1, work.layers) if per_layer else 0)


def optimizer_update_s(works: list[StageWork], model: CostModel) -> float:
    """Seconds of the optimizer's update on one rank: memory-bound over the parameters it owns.

    Sharded (ZeRO >= 1), a rank updates its ``1 / shard_ranks`` of the dense parameters
    (DP x CP) and its ``1 / expert_dp`` of the expert parameters.
    """
    layout, training = model.layout, model.scenario.training
    dense = sum(w.params for w in works)
    experts = sum(w.expert_params for w in works)
    sharded = layout.zero_stage >= 1
    updated = dense / layout.shard_ranks + experts / layout.expert_dp if sharded else dense + experts
    unsharded_grads = 0.0 if layout.zero_stage >= 2 else dense + experts
    # fp8 parameters: the master weight is cast to 1 byte instead of 2
    per_param = OPTIMIZER_STEP_BYTES_PER_PARAM[training.optimizer] - (1 if training.fp8_params else 0)
    return (updated * per_param + unsharded_grads * GRAD_ZERO_BYTES_PER_PARAM) / model.compute.memory_bandwidth


def param_gather_bytes(model: CostModel) -> int:
    """Bytes per parameter of the distributed optimizer's parameter all-gather."""
    return FP8_PARAM_GATHER_BYTES if model.scenario.training.fp8_params else PARAM_GATHER_BYTES


def param_gather_s(works: list[StageWork], model: CostModel) -> float:
    """Seconds of the all-gather of the updated parameters after a sharded optimizer (ZeRO-1/2)."""
    layout = model.layout
    if layout.zero_stage not in (1, 2):
        return 0.0
    dense = sum(w.params for w in works)
    experts = sum(w.expert_params for w in works)
    per_param = param_gather_bytes(model)
    seconds = collective_time("all-gather", dense * per_param, model.placements["zero"], model.system)
    if experts:
        seconds += collective_time("all-gather", experts * per_param, model.placements["edp"],
                                   model.system)
    return seconds


def grad_stats_placement(model: CostModel) -> GroupPlacement:
    """The ranks that hold distinct pieces of the gradient: the whole model (TP x PP) and, when
    the optimizer is sharded, every shard of it (DP x CP). Megatron reduces the gradient norm
    and the fp16 inf/nan flag over them (``clip_grad_norm_fp32``, ``get_grad_stats_parallel_group``)."""
    layout = model.layout
    dims = [("tp", layout.tp), ("pp", layout.pp)]
    if layout.zero_stage >= 1:
        dims += [("cp", layout.cp), ("dp", layout.zero_shard_size)]
    ranks = [0]
    for dim, size in dims:
        stride = layout.stride(dim)
        ranks = [rank + i * stride for rank in ranks for i in range(size)]
    return place_ranks(sorted(ranks), layout.devices_per_node, layout.devices)


def grad_checks_s(works: list[StageWork], model: CostModel) -> float:
    """Seconds of the checks on the gradients before the update.

    With ``training.clip_grad`` the global gradient norm: each rank's squared norm (its read
    of the gradients is in the update's bytes) summed by an all-reduce of one number over
    the ranks holding distinct gradients, which the host waits for (``.item()``). With fp16
    loss scaling, before it: the unscale and inf/nan check of the fp32 gradients the rank
    owns (read and write, 8 B each) and an all-reduce of the found-inf flag.
    """
    training = model.scenario.training
    syncs = int(training.clip_grad) + int(training.dtype == "fp16")
    if syncs == 0:
        return 0.0
    allreduce_s = model.per_step.get("grad_stat_allreduce_s")
    if allreduce_s is None:  # the same for every stage and step of a layout: priced once
        allreduce_s = collective_time("all-reduce", GRAD_STAT_BYTES, grad_stats_placement(model), model.system)
        model.per_step["grad_stat_allreduce_s"] = allreduce_s
    seconds = syncs * allreduce_s
    if training.dtype == "fp16":
        layout = model.layout
        owned = sum(w.params for w in works) / (layout.shard_ranks if layout.zero_stage >= 1 else 1)
        owned += sum(w.expert_params for w in works) / (layout.expert_dp if layout.zero_stage >= 1 else 1)
        seconds += owned * UNSCALE_BYTES_PER_PARAM / model.compute.memory_bandwidth
    return seconds


def optimizer_s(works: list[StageWork], model: CostModel) -> float:
    """Seconds of one rank's optimizer step: the checks on the gradients, the update, and the
    parameter all-gather when it is sharded and not overlapped with the next forward
    (``training.overlap_param_gather``)."""
    seconds = grad_checks_s(works, model) + optimizer_update_s(works, model)
    if not model.scenario.training.overlap_param_gather:
        seconds += param_gather_s(works, model)
    return seconds


def param_gather_exposed_s(work: StageWork, model: CostModel, forward_compute_s: float, bucketed: bool,
                           aligned: bool, head_s: float = 0.0, per_layer: bool = False) -> float:
    """Seconds a stage's first forward of the step waits for the parameter all-gather when it
    is overlapped with the forward (Megatron-Core's ``--overlap-param-gather``).

    The buckets are gathered in forward order (the reverse of the backward's). Megatron-Core
    waits for a bucket in the forward pre-hook of its first module, and that wait dispatches
    the next bucket's all-gather (``finish_param_sync``,
    megatron/core/distributed/param_and_grad_buffer.py), so gather ``i`` runs beside the
    compute of bucket ``i - 1``'s layers. With ``aligned`` (interleaved schedules:
    ``align_param_gather``) every bucket is dispatched at the start of the step, one after
    the other, while the stage waits ``head_s`` for its first input anyway. A bucket's
    share of the forward is its share of the stage's parameters. The compute beside a gather
    runs on the SMs the gather leaves it (``cost/contention.py``). ``per_layer``: one bucket
    per layer (FSDP's units, ``Layout.fsdp_pipelined``), each prefetched while the layer
    before it computes.
    """
    layers = max(1, work.layers)
    sizes = (work.params / layers,) * layers if per_layer else bucket_sizes(work.params, model, bucketed)
    total = sum(sizes)
    if total <= 0 or model.placements["zero"].size <= 1:
        return 0.0
    place = model.placements["zero"]
    seconds = [collective_time("all-gather", params * param_gather_bytes(model), place, model.system)
               for params in sizes]
    gather_end = seconds[0]
    busy = [(0.0, gather_end)]
    compute_end = head_s if aligned else 0.0
    for index, params in enumerate(sizes):
        compute_start = max(compute_end, gather_end)
        if index + 1 < len(sizes):
            # the next bucket's gather: already queued behind this one (aligned), else dispatched
            # now, when this bucket's compute is about to start
            gather_start = gather_end if aligned else max(gather_end, compute_start)
            busy.append((gather_start, gather_start + seconds[index + 1]))
        compute_end = end_beside(compute_start, forward_compute_s * params / total, busy, model.comm_sm_fraction)
        if index + 1 < len(sizes):
            gather_end = busy[-1][1]
    return max(0.0, compute_end - (head_s if aligned else 0.0) - forward_compute_s)


def pipeline_transfer_s(workload: Workload, model: CostModel, rank_a: int, rank_b: int,
                        cut: int | None = None) -> float:
    """Seconds to send one microbatch's activation (or gradient) between two pipeline ranks
    across the cut after stage ``cut`` (None: the largest cut's size)."""
    if rank_a == rank_b:
        return 0.0
    return p2p_time(workload.boundary_bytes(cut), pipeline_pair(model.layout, rank_a, rank_b), model.system)


def pipeline_transfer_spec(workload: Workload, model: CostModel, rank_a: int, rank_b: int, cut: int | None = None
                           ) -> tuple[float, float, tuple]:
    """(latency, seconds on the wire alone, links) of a pipeline transfer, for contention.

    Inside a node it leaves through the sender's fabric port and enters the receiver's;
    across nodes through their NICs (each rank's share of its node's NICs).
    """
    total = pipeline_transfer_s(workload, model, rank_a, rank_b, cut)
    same_node = pipeline_neighbours_share_node(model.layout, rank_a, rank_b)
    pair = pipeline_pair(model.layout, rank_a, rank_b)
    latency = min(total, p2p_time(1.0, pair, model.system))  # a one-byte message is all latency
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
