"""The simulated step in a profiler's terms: GPU time per kernel category on each rank.

A simulated action carries segments (``cost.actions.Segment``): one per compute op and
per collective, in the order ``CostModel.price`` walks the pass's blocks, each with its
seconds as priced (calibration, slowdowns and the fitted overhead included). Walking the
same pass in the same order gives every segment its op, and the op's kind its category:
GEMMs are ``gemm`` (``convolution`` when the op is a convolution layer's implicit GEMM),
fused attention ``attention``, memory-bound ops ``elementwise``, collectives
``collective`` by kind. Outside the actions, a rank's step also holds its pipeline
transfers (``send-recv``), its DP gradient reductions and the optimizer step
(``elementwise``), from the timeline's records.
"""

from __future__ import annotations

from collections import defaultdict

from mpsim.schedules.actions import Overlapped, parts, priced_kind
from mpsim.simulate import SimulationResult
from mpsim.workload.ops import Op, Overlap, Pass

# mpsim's op kinds as the trace reader's kernel categories
KIND_CATEGORY = {"gemm": "gemm", "attention": "attention", "memory": "elementwise"}


def _ops_in_order(work: Pass) -> list[tuple[str, Op]]:
    """(segment label, op) in the order ``CostModel.price`` writes a pass's segments."""
    found = []
    for block in work:
        if block.gather is not None:
            found.append((f"{block.label} {block.gather.name}", block.gather))
        for item in block.items:
            if isinstance(item, Overlap):
                found.append((f"{block.label} {item.comm.name}", item.comm))
                found.extend((f"{block.label} {op.name}", op) for op in item.compute)
            else:
                found.append((f"{block.label} {item.name}", item))
    return found


def convolution_ops(result: SimulationResult) -> frozenset[str]:
    """Names of the ops that are convolutions (a layer stack's conv layers), which mpsim prices as GEMMs."""
    from mpsim.specs.stack import LayerStackSpec, stack_units

    model = result.scenario.model
    if not isinstance(model, LayerStackSpec):
        return frozenset()
    names = set()
    for unit in stack_units(model):
        for placed in unit.layers:
            if placed.layer.kind in ("conv1d", "conv2d"):
                names.update((placed.label, f"{placed.label}.dgrad", f"{placed.label}.wgrad"))
    return frozenset(names)


def op_category(op: Op, convolutions: frozenset[str]) -> str:
    """The trace category of an mpsim op: ``collective:KIND`` for a collective."""
    if op.kind == "collective":
        return f"collective:{op.collective}"
    if op.kind == "gemm" and op.name in convolutions:
        return "convolution"
    return KIND_CATEGORY.get(op.kind, "other")


def segment_categories(result: SimulationResult, item, convolutions: frozenset[str]
                       ) -> list[tuple[float, float, str]]:
    """(offset s, seconds, category) of every segment of one action (or overlapped pair); ``other``
    for what is no op (the fitted per-action overhead)."""
    ops: list[tuple[str, Op]] = []
    for action in parts(item):
        ops += _ops_in_order(result.workload.pass_of(action.stage, priced_kind(action)))
    found = []
    index = 0
    for segment in result.cost(item).segments:
        if index < len(ops) and ops[index][0] == segment.label:
            found.append((segment.offset_s, segment.duration_s, op_category(ops[index][1], convolutions)))
            index += 1
        else:
            found.append((segment.offset_s, segment.duration_s, "other"))
    return found


def action_categories(result: SimulationResult, item, convolutions: frozenset[str]) -> dict[str, float]:
    """Seconds of one action (or overlapped pair) by category."""
    totals: dict[str, float] = defaultdict(float)
    for _, seconds, category in segment_categories(result, item, convolutions):
        totals[category] += seconds
    return dict(totals)


def sync_category(kind: str, label: str) -> str:
    """The category of a timeline sync: the optimizer step is memory-bound, the rest collectives."""
    if kind == "optimizer":
        return "elementwise"
    text = label.replace("_", "-")
    if "reduce-scatter" in text:
        return "collective:reduce-scatter"
    if "gather" in text:
        return "collective:all-gather"
    return "collective:all-reduce"


def rank_categories(result: SimulationResult) -> list[dict[str, float]]:
    """For each pipeline rank, the simulated step's seconds by category (collectives as
    ``collective:KIND``)."""
    convolutions = convolution_ops(result)
    timeline = result.timeline
    per_item: dict[str, dict[str, float]] = {}
    out: list[dict[str, float]] = []
    for rank, records in enumerate(timeline.actions):
        totals: dict[str, float] = defaultdict(float)
        for record in records:
            key = str(record.action)
            if key not in per_item:
                per_item[key] = action_categories(result, record.action, convolutions)
            for category, seconds in per_item[key].items():
                totals[category] += seconds
        for sync in timeline.syncs_of(rank):
            totals[sync_category(sync.kind, sync.label)] += sync.end_s - sync.start_s
        out.append(totals)
    for transfer in timeline.transfers:
        for rank in {transfer.src_rank, transfer.dst_rank}:
            out[rank]["collective:send-recv"] += transfer.end_s - transfer.start_s
    return [dict(totals) for totals in out]


def item_kind(item) -> str:
    """F, B, I, W, or F&B for an overlapped pair."""
    return "F&B" if isinstance(item, Overlapped) else item.kind
