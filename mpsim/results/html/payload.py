"""What the HTML report draws, as plain JSON-ready data.

The page draws from columns of integers, not from one object per action: a 100,000-action
timeline is then a few megabytes that the browser parses in well under a second, and the
canvas code walks flat arrays. Times are whole nanoseconds from the start of the step
(the trace uses the same unit), bytes are whole bytes.

Per pipeline rank the payload holds its actions (start, duration, kind, microbatch, the
backward microbatch of an overlapped pair, model chunk, cost), its idle intervals by cause
(the same split the bubble attribution uses, ``mpsim/results/idle.py``), its
synchronisations (gradient reduction, optimizer step) and its memory over the step.
Actions of the same stage and kind share one cost entry: the action's duration, its
exposed collectives and its time by op, largest first, which is what hovering an action
shows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from mpsim.results.idle import KINDS as IDLE_KINDS
from mpsim.results.idle import idle_intervals
from mpsim.results.memory import memory_timeline
from mpsim.results.metrics import Summary
from mpsim.results.report import summary_dict
from mpsim.results.trace import whole_ns
from mpsim.schedules.actions import Overlapped
from mpsim.simulate import BubbleReference, SimulationResult

# drawing order, colours and names of the kinds in the report (the PNG timeline keeps its own, mpsim/results/plot.py)
ACTION_KINDS = ("F", "B", "W", "FB")
SYNC_KINDS = ("dp-comm", "embedding-sync", "optimizer")
KINDS = ACTION_KINDS + IDLE_KINDS + SYNC_KINDS
COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#8C8C3F", "FB": "#3E9C9C", "schedule": "#E4E4E4",
          "imbalance": "#F2DC9B", "stage-wait": "#F2DC9B", "transfer": "#F4B6B0", "send": "#D5C6EC", "gather": "#C9C0E4",
          "dp-comm": "#8172B3", "embedding-sync": "#B07AA1", "optimizer": "#937860"}
LABELS = {"F": "forward", "B": "backward", "W": "weight gradient", "FB": "forward+backward (overlapped pair)",
          "schedule": "idle: fill and drain", "imbalance": "idle: stage imbalance", "stage-wait": "idle: other stage",
          "transfer": "idle: transfer in flight", "send": "idle: own blocking send",
          "gather": "idle: waiting for a chunk's parameters",
          "dp-comm": "gradient reduction", "embedding-sync": "embedding gradient sync", "optimizer": "optimizer step"}
OPS_SHOWN = 8  # ops listed per action on hover; the rest are summed as "other"


class _Costs:
    """One entry per distinct action cost, in first-seen order."""

    def __init__(self):
        self.index: dict[int, int] = {}
        self.entries: list[dict[str, Any]] = []

    def of(self, cost) -> int:
        key = id(cost)
        found = self.index.get(key)
        if found is not None:
            return found
        by_op: dict[str, float] = defaultdict(float)
        for segment in cost.segments:
            # "layer 3 attn.qkv" -> "attn.qkv (compute)": one line per op over the chunk's layers
            name = segment.label.rsplit(" ", 1)[-1]
            by_op[f"{name} ({segment.stream})"] += segment.duration_s
        ranked = sorted(by_op.items(), key=lambda item: -item[1])
        ops = [[name, whole_ns(seconds)] for name, seconds in ranked[:OPS_SHOWN]]
        rest = sum(seconds for _, seconds in ranked[OPS_SHOWN:])
        if rest > 0:
            ops.append([f"{len(ranked) - OPS_SHOWN} other ops", whole_ns(rest)])
        exposed = [[group, whole_ns(seconds)] for group, seconds in cost.exposed_by_group if seconds > 0]
        if cost.dp_exposed_s > 0:
            exposed.append(["zero-gather", whole_ns(cost.dp_exposed_s)])
        self.entries.append({"duration": whole_ns(cost.duration_s), "compute": whole_ns(cost.compute_s),
                             "tflop": round(cost.flops / 1e12, 3), "exposed": exposed, "ops": ops})
        self.index[key] = len(self.entries) - 1
        return self.index[key]


def _rank_actions(result: SimulationResult, rank: int, costs: _Costs) -> dict[str, list[int]]:
    start, duration, kind, microbatch, pair, chunk, cost = ([] for _ in range(7))
    for record in result.timeline.actions[rank]:
        item = record.action
        if isinstance(item, Overlapped):
            kind.append(ACTION_KINDS.index("FB"))
            microbatch.append(item.forward.microbatch)
            pair.append(item.backward.microbatch)
            chunk.append(item.forward.stage)
        else:
            kind.append(ACTION_KINDS.index("B" if item.kind == "I" else item.kind))
            microbatch.append(item.microbatch)
            pair.append(-1)
            chunk.append(item.stage)
        begin = whole_ns(record.start_s)
        start.append(begin)
        duration.append(max(0, whole_ns(record.end_s) - begin))
        cost.append(costs.of(result.cost(item)))
    return {"start": start, "duration": duration, "kind": kind, "microbatch": microbatch, "pair": pair,
            "chunk": chunk, "cost": cost}


def _rank_idle(result: SimulationResult, rank: int, reference: BubbleReference | None) -> dict[str, list[int]]:
    timeline = result.timeline
    waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
    start, duration, kind = [], [], []
    for gap in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
        begin = whole_ns(gap.start_s)
        start.append(begin)
        duration.append(max(0, whole_ns(gap.end_s) - begin))
        kind.append(KINDS.index(gap.kind))
    return {"start": start, "duration": duration, "kind": kind}


def _rank_memory(result: SimulationResult, summary: Summary, rank: int) -> dict[str, Any]:
    memory = summary.memory[rank]
    points = memory_timeline(result.timeline, result.schedule, result.workload, result.layout, rank)
    return {"resident": round(memory.peak_memory_bytes - memory.activations_peak_bytes - memory.gathered_params_bytes),
            "peak": round(memory.peak_memory_bytes), "time": [whole_ns(t) for t, _ in points],
            "held": [round(level) for _, level in points]}


def run_payload(result: SimulationResult, summary: Summary, reference: BubbleReference | None,
                title: str) -> dict[str, Any]:
    """Everything the report shows about one simulated step."""
    timeline = result.timeline
    costs = _Costs()
    ranks = []
    for rank in range(timeline.num_ranks):
        syncs = [s for s in timeline.syncs if s.rank == rank]
        ranks.append({
            "actions": _rank_actions(result, rank, costs),
            "idle": _rank_idle(result, rank, reference),
            "syncs": {"start": [whole_ns(s.start_s) for s in syncs],
                      "duration": [max(0, whole_ns(s.end_s) - whole_ns(s.start_s)) for s in syncs],
                      "kind": [KINDS.index(s.kind) for s in syncs], "label": [s.label for s in syncs]},
            "memory": _rank_memory(result, summary, rank),
        })
    return {"title": title, "summary": summary_dict(summary), "step_ns": whole_ns(timeline.span_s),
            "ranks": ranks, "costs": costs.entries}


def legend() -> dict[str, Any]:
    """Kinds, colours and labels, shared by every run of a report."""
    return {"kinds": list(KINDS), "action_kinds": list(ACTION_KINDS), "idle_kinds": list(IDLE_KINDS),
            "colors": COLORS, "labels": LABELS}
