"""The main path, top to bottom: scenario -> layout -> schedule -> workload -> costs -> engine.

Each step is a plain function of plain data from the layer below (see
docs/architecture.md); this module only wires them together in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable
from pathlib import Path

from mpsim.cost.actions import ActionCost, CostModel, overlapped_cost, stage_costs
from mpsim.cost.step import (final_grad_buckets, group_links, microbatch_grad_buckets, optimizer_s,
                             pipeline_transfer_s, pipeline_transfer_spec, tied_embedding_sync_s)
from mpsim.engine import EngineInput, GradBucket, Timeline, rank_spans, simulate as run_engine
from mpsim.engine.core import TransferSpec, duration_key
from mpsim.resolve import resolve
from mpsim.schedules.actions import Overlapped
from mpsim.errors import InputError
from mpsim.schedules import Schedule, ScheduleError, build_schedule
from mpsim.schedules.zb_search import SEARCHED, StageTimes
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload import Workload, build_workload


@dataclass
class SimulationResult:
    """Everything a simulation produced, for the results layer to report."""

    scenario: Scenario
    layout: Layout
    schedule: Schedule
    workload: Workload
    costs: dict[tuple, ActionCost]  # by engine.core.duration_key of an action or overlapped pair
    timeline: Timeline
    engine_input: EngineInput

    def cost(self, item) -> ActionCost:
        """The cost of a schedule item (action or overlapped pair)."""
        return self.costs[duration_key(item)]


def plan_schedule(scenario: Scenario, layout: Layout, base_dir: Path | None = None) -> Schedule:
    """The validated schedule of the plan; problems are reported against parallel.schedule."""
    try:
        return build_schedule(scenario.parallel.schedule, layout.pp, layout.vpp, layout.num_microbatches, base_dir,
                              timer=rank_spans)
    except ScheduleError as exc:
        raise InputError(str(exc), field="parallel.schedule") from None


def searched_schedule(schedule: Schedule, workload: Workload, model: CostModel) -> Schedule:
    """A searched schedule (zb-1p, zb-2p) found again for this scenario's stage and transfer times.

    The registry builds it with unit times (all a name and a layout give); the search
    needs the priced forward, input-gradient and weight-gradient times of every stage.
    """
    costs = stage_costs(workload, model)
    stages = range(schedule.num_stages)
    rank_of = schedule.stage_to_rank
    transfer_s = max((pipeline_transfer_s(workload, model, rank_of[s], rank_of[s + 1], s) for s in stages[:-1]),
                     default=0.0)
    times = StageTimes(tuple(costs[(s, "F")].duration_s for s in stages),
                       tuple(costs[(s, "I")].duration_s for s in stages),
                       tuple(costs[(s, "W")].duration_s for s in stages), transfer_s)
    return SEARCHED[schedule.name](times, schedule.num_microbatches, rank_spans)


def engine_input(scenario: Scenario, layout: Layout, workload: Workload, schedule: Schedule, model: CostModel,
                 costs: dict[tuple[int, str], ActionCost]) -> EngineInput:
    """The engine's plain-number input for one step."""
    rank_of = schedule.stage_to_rank
    chains = schedule.topology
    contention = scenario.training.network_contention
    transfer: dict[tuple[int, int], float] = {}
    transfer_links: dict[tuple[int, int], TransferSpec] = {}
    for stage in range(schedule.num_stages):
        after = chains.next(stage)  # pipeline links join the stages of a chain only
        if after is None:
            continue
        a, b = rank_of[stage], rank_of[after]
        seconds = pipeline_transfer_s(workload, model, a, b, stage)
        transfer[(stage, after)] = transfer[(after, stage)] = seconds
        if contention and a != b:
            transfer_links[(stage, after)] = TransferSpec(*pipeline_transfer_spec(workload, model, a, b, stage))
            transfer_links[(after, stage)] = TransferSpec(*pipeline_transfer_spec(workload, model, b, a, stage))

    # links pipeline transfers use: a DP bucket only needs to share a link one of them uses
    busy_links = {link for spec in transfer_links.values() for link in spec.links}

    shared_links: dict[tuple, tuple] = {}  # (group, rank) -> the links its buckets share with transfers

    def bucket(spec: tuple, rank: int) -> GradBucket:
        ready, seconds, label, group = spec
        links = ()
        if contention:
            key = (group if isinstance(group, str) else id(group), rank)
            links = shared_links.get(key)
            if links is None:
                links = shared_links[key] = tuple(link for link in group_links(model, group, rank)
                                                  if link in busy_links)
        return GradBucket(ready, seconds, label, links)

    copies = block_copy_ranks(schedule)
    final_specs: dict[tuple, tuple] = {}  # stages of equal work (one object) have the same reductions

    def final_buckets(stage: int, work) -> tuple[GradBucket, ...]:
        key = (id(work), copies[stage])
        specs = final_specs.get(key)
        if specs is None:
            specs = final_specs[key] = final_grad_buckets(work, model, copies[stage])
        return tuple(bucket(spec, rank_of[stage]) for spec in specs)

    buckets = {stage: final_buckets(stage, work) for stage, work in enumerate(workload.stages)}
    # asynchronous reductions some actions start on the DP stream (ZeRO-2 per microbatch,
    # ZeRO-3 per layer); every action of a (stage, kind) runs on the same rank
    action_buckets: dict[tuple, tuple[GradBucket, ...]] = {}
    for key, cost in costs.items():
        rank = rank_of[key[0]]
        per_action = [(*spec, "zero") for spec in cost.async_dp]
        if key[1] in ("B", "W") and len(key) == 2:
            per_action += microbatch_grad_buckets(workload.stages[key[0]], model, copies[key[0]])
        if per_action:
            action_buckets[key] = tuple(bucket(spec, rank) for spec in per_action)
    works_per_rank: list[list] = [[] for _ in range(schedule.num_ranks)]
    for stage, work in enumerate(workload.stages):
        works_per_rank[rank_of[stage]].append(work)
    first, last = rank_of[0], rank_of[-1]
    pair_syncs: tuple[tuple[int, int, float, str], ...] = ()
    if scenario.model.tied_embeddings and first != last:
        pair_syncs = ((first, last, tied_embedding_sync_s(workload, model, first, last),
                       "tied embedding grad all-reduce"),)
    # ranks sharing copies of a block reduce its gradients in one collective, which ends
    # only when both have produced them: neither rank's optimizer starts before the other's
    joined = sorted({(min(ranks), max(ranks)) for ranks in copies if len(ranks) == 2})
    pair_syncs += tuple((a, b, 0.0, "block copies' gradients reduced together") for a, b in joined)
    return EngineInput(
        schedule=schedule,
        action_s={key: cost.duration_s for key, cost in costs.items()},
        transfer_s=transfer,
        grad_buckets=buckets,
        overlap_grad_sync=scenario.training.overlap_grad_reduce,
        pair_syncs=pair_syncs,
        finalize_s=tuple(optimizer_s(works, model) for works in works_per_rank),
        action_buckets=action_buckets,
        send_blocking=scenario.training.pp_send_blocking,
        transfer_links=transfer_links if contention else None,
    )


def block_copy_ranks(schedule: Schedule) -> list[tuple[int, ...]]:
    """Per stage: the pipeline ranks holding a copy of its layer block, when several do (else ())."""
    chains = schedule.topology
    if chains.count == 1:
        return [()] * schedule.num_stages
    holders: dict[int, set[int]] = {}
    for stage, rank in enumerate(schedule.stage_to_rank):
        holders.setdefault(chains.block(stage), set()).add(rank)
    ranks_of = [sorted(holders[chains.block(stage)]) for stage in range(schedule.num_stages)]
    return [tuple(ranks) if len(ranks) > 1 else () for ranks in ranks_of]


def schedule_costs(schedule: Schedule, workload: Workload, model: CostModel) -> dict[tuple, ActionCost]:
    """Costs of every (stage, kind), plus every overlapped pair the schedule runs."""
    costs: dict[tuple, ActionCost] = dict(stage_costs(workload, model))
    for actions in schedule.actions:
        for item in actions:
            if isinstance(item, Overlapped):
                key = duration_key(item)
                if key not in costs:
                    costs[key] = overlapped_cost(costs[(item.forward.stage, "F")],
                                                 costs[(item.backward.stage, item.backward.kind)])
    return costs


def simulate(scenario: Scenario, base_dir: Path | None = None, *,
             engine: Callable[[EngineInput], Timeline] = run_engine, layout: Layout | None = None,
             schedule: Schedule | None = None) -> SimulationResult:
    """Simulate one training step of ``scenario``.

    ``engine`` runs the step (the SimPy engine; a sweep may pass a faster evaluator of the
    same input); a caller that already resolved the layout or built the schedule passes them.
    """
    layout = layout or resolve(scenario)
    schedule = schedule or plan_schedule(scenario, layout, base_dir)
    if schedule.chains != layout.chains:
        # a schedule file that names several pipelines: the layers split into blocks per chain
        layout = resolve(scenario, chains=schedule.chains)
    workload = build_workload(scenario, layout)
    model = CostModel(scenario, layout)
    if schedule.name in SEARCHED:
        schedule = searched_schedule(schedule, workload, model)
    costs = schedule_costs(schedule, workload, model)
    inp = engine_input(scenario, layout, workload, schedule, model, costs)
    return SimulationResult(scenario, layout, schedule, workload, costs, engine(inp), inp)


@dataclass(frozen=True)
class BubbleReference:
    """How long each action waits in the same schedule with balanced stages and free communication.

    Every stage costs the mean of its kind, transfers take no time and sends do not
    block; what idle time remains is the schedule's own fill and drain. For each rank:
    the wait before each action (before the first: the warm-up) and after the last
    (the cool-down). Comparing a real gap with its reference splits it into schedule
    structure and stage imbalance.
    """

    waits_before: tuple[tuple[float, ...], ...]
    drain_after: tuple[float, ...]


def bubble_reference(result: SimulationResult) -> BubbleReference:
    """Re-run the step with balanced stages and free pipeline communication."""
    inp = result.engine_input
    by_kind: dict[tuple, list[float]] = {}
    for key, seconds in inp.action_s.items():
        by_kind.setdefault(key[1::2], []).append(seconds)  # ("F",), ("B",), ("F", "B") for pairs
    mean = {kind: sum(values) / len(values) for kind, values in by_kind.items()}
    balanced = replace(inp, action_s={key: mean[key[1::2]] for key in inp.action_s},
                       transfer_s={key: 0.0 for key in inp.transfer_s}, send_blocking=False, grad_buckets={},
                       pair_syncs=(), finalize_s=(), action_buckets={}, transfer_links=None)
    timeline = run_engine(balanced)
    end = timeline.pipeline_end_s
    waits = []
    for records in timeline.actions:
        ready = [0.0] + [r.end_s for r in records[:-1]]
        waits.append(tuple(r.start_s - before for r, before in zip(records, ready)))
    return BubbleReference(tuple(waits), tuple(end - (r[-1].end_s if r else 0.0) for r in timeline.actions))
