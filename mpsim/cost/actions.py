"""From per-stage work to the seconds the engine runs on.

Each pass of a stage (forward, combined backward, input-gradient, weight-gradient) is
priced op by op into an :class:`ActionCost`: its duration on the compute stream and
the segments inside it (compute ops, TP collectives, and how much of each collective
hides under compute). Stages that share their work share their costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpsim.cost.collectives import collective_time, p2p_time
from mpsim.cost.compute import ComputeModel
from mpsim.cost.topology import group_placement, pipeline_neighbours_share_node, place_ranks
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.ops import Op, Overlap, Pass
from mpsim.workload.stages import Workload

# Adam step per parameter (Megatron mixed precision): read the fp32 grad for the global norm
# used by clipping (4 B); read fp32 grad, master weight, m, v (16 B) and write master, m, v
# (12 B) in the fused Adam kernel; copy the master weight to the bf16 model weight (4 B
# read, 2 B written).
ADAM_BYTES_PER_PARAM = 38
GRAD_ZERO_BYTES_PER_PARAM = 4


@dataclass(frozen=True)
class Segment:
    """A piece of an action: a compute op on the compute stream or a collective on the TP stream."""

    stream: str  # "compute" or "tp"
    category: str  # "forward", "backward", "recompute", "weight-grad", "tp-comm"
    label: str
    offset_s: float
    duration_s: float


@dataclass(frozen=True)
class ActionCost:
    """Seconds of one action and what they are made of."""

    duration_s: float
    compute_s: float
    tp_comm_s: float
    tp_exposed_s: float
    flops: float
    segments: tuple[Segment, ...]


class CostModel:
    """Prices ops, collectives and passes for one scenario and layout."""

    def __init__(self, scenario: Scenario, layout: Layout):
        self.scenario = scenario
        self.layout = layout
        self.system = scenario.cluster.system
        self.compute = ComputeModel(self.system.accelerator, scenario.training.dtype)
        self.placements = {dim: group_placement(layout, dim) for dim in ("tp", "dp", "pp")}
        # share of the SMs a running collective takes from compute that overlaps it
        self.comm_sm_fraction = min(1.0, self.system.collective_channels / self.system.accelerator.compute_units)
        self._passes: dict[int, tuple[Pass, ActionCost]] = {}

    def collective_s(self, op: Op) -> float:
        """Seconds of a collective op on its group."""
        assert op.collective is not None
        return collective_time(op.collective, op.message_bytes, self.placements[op.group], self.system)

    def overlapped_s(self, compute_s: float, comm_s: float) -> float:
        """Wall time of ``compute_s`` of work overlapped with a ``comm_s`` collective.

        The collective's kernels hold some SMs while it runs, so the compute beside it
        runs at ``1 - f`` of its speed until the collective ends.
        """
        slow = 1.0 - self.comm_sm_fraction
        if compute_s <= comm_s * slow:
            return comm_s
        return compute_s + comm_s * self.comm_sm_fraction

    def price(self, work: Pass) -> ActionCost:
        """Duration and segments of a pass (cached per pass object)."""
        cached = self._passes.get(id(work))
        if cached is not None and cached[0] is work:
            return cached[1]
        clock = compute = comm = exposed = flops = 0.0
        segments: list[Segment] = []
        for block in work:
            for item in block.items:
                if isinstance(item, Overlap):
                    comm_s = self.collective_s(item.comm)
                    segments.append(Segment("tp", "tp-comm", f"{block.label} {item.comm.name}", clock, comm_s))
                    busy = 0.0
                    for op in item.compute:
                        op_s = self.compute.time(op)
                        segments.append(Segment("compute", block.category, f"{block.label} {op.name}",
                                                clock + busy, op_s))
                        busy += op_s
                        flops += op.flops
                    span = self.overlapped_s(busy, comm_s)
                    clock += span
                    compute += busy
                    comm += comm_s
                    exposed += max(0.0, span - busy)
                elif item.kind == "collective":
                    comm_s = self.collective_s(item)
                    segments.append(Segment("tp", "tp-comm", f"{block.label} {item.name}", clock, comm_s))
                    clock += comm_s
                    comm += comm_s
                    exposed += comm_s
                else:
                    op_s = self.compute.time(item)
                    segments.append(Segment("compute", block.category, f"{block.label} {item.name}", clock, op_s))
                    clock += op_s
                    compute += op_s
                    flops += item.flops
        cost = ActionCost(clock, compute, comm, exposed, flops, tuple(segments))
        self._passes[id(work)] = (work, cost)
        return cost


def stage_costs(workload: Workload, model: CostModel) -> dict[tuple[int, str], ActionCost]:
    """(stage, kind) -> ActionCost for every stage and action kind."""
    costs: dict[tuple[int, str], ActionCost] = {}
    for stage, work in enumerate(workload.stages):
        costs[(stage, "F")] = model.price(work.forward)
        costs[(stage, "B")] = model.price(work.backward)
        costs[(stage, "I")] = model.price(work.backward_input)
        costs[(stage, "W")] = model.price(work.backward_weight)
    return costs


def overlapped_cost(forward: ActionCost, backward: ActionCost) -> ActionCost:
    """A forward and a backward run as one overlapped step (DualPipe's F&B).

    Their compute shares the device and adds up; each one's exposed communication can
    hide under the other's compute, so only what exceeds the pair's compute shows.
    """
    compute = forward.compute_s + backward.compute_s
    exposed = max(0.0, forward.tp_exposed_s + backward.tp_exposed_s - compute)
    shift = forward.duration_s
    segments = forward.segments + tuple(
        Segment(seg.stream, seg.category, seg.label, seg.offset_s + shift, seg.duration_s) for seg in backward.segments)
    # the pair's segments are laid end to end; the span is the overlapped duration
    return ActionCost(compute + exposed, compute, forward.tp_comm_s + backward.tp_comm_s, exposed,
                      forward.flops + backward.flops, segments)


def grad_buckets(params: float, model: CostModel) -> tuple[tuple[float, float, str], ...]:
    """DP gradient buckets of a stage: (ready fraction of its last backward, seconds, label)."""
    layout, training = model.layout, model.scenario.training
    if layout.dp == 1 or params <= 0:
        return ()
    grad_bytes = params * (4 if training.fp32_grad_accumulation else 2)
    count = max(1, math.ceil(grad_bytes / training.grad_reduce_bucket_bytes))
    kind = "reduce-scatter" if training.distributed_optimizer else "all-reduce"
    seconds = collective_time(kind, grad_bytes / count, model.placements["dp"], model.system)
    return tuple(((i + 1) / count, seconds, f"grad {kind} {i + 1}/{count}") for i in range(count))


def optimizer_s(params: float, model: CostModel) -> float:
    """Seconds of the optimizer step (and the parameter all-gather when it is sharded)."""
    layout, training = model.layout, model.scenario.training
    bandwidth = model.compute.memory_bandwidth
    shard = params / layout.dp if training.distributed_optimizer else params
    seconds = (shard * ADAM_BYTES_PER_PARAM + params * GRAD_ZERO_BYTES_PER_PARAM) / bandwidth
    if training.distributed_optimizer and layout.dp > 1:
        seconds += collective_time("all-gather", params * 2, model.placements["dp"], model.system)
    return seconds


def pipeline_transfer_s(workload: Workload, model: CostModel, rank_a: int, rank_b: int) -> float:
    """Seconds to send one microbatch's activation (or gradient) between two pipeline ranks."""
    if rank_a == rank_b:
        return 0.0
    same_node = pipeline_neighbours_share_node(model.layout, rank_a, rank_b)
    return p2p_time(workload.p2p_bytes, same_node, model.system)


def tied_embedding_sync_s(workload: Workload, model: CostModel, rank_a: int, rank_b: int) -> float:
    """Megatron all-reduces the tied embedding's fp32 gradient between first and last stage."""
    layout = model.layout
    place = place_ranks([rank_a * layout.stride("pp"), rank_b * layout.stride("pp")], layout.devices_per_node)
    grad_bytes = workload.vocab_padded // layout.tp * model.scenario.model.hidden_size * 4
    return collective_time("all-reduce", grad_bytes, place, model.system)
