"""The main path, top to bottom: scenario -> layout -> schedule -> workload -> costs -> engine.

Each step is a plain function of plain data from the layer below (see
docs/architecture.md); this module only wires them together in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpsim.cost.actions import (ActionCost, CostModel, grad_buckets, optimizer_s, pipeline_transfer_s, stage_costs,
                                tied_embedding_sync_s)
from mpsim.engine import EngineInput, GradBucket, Timeline, simulate as run_engine
from mpsim.errors import InputError
from mpsim.schedules import Schedule, ScheduleError, build_schedule
from mpsim.specs.layout import Layout, resolve_layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.stages import Workload, build_workload


@dataclass
class SimulationResult:
    """Everything a simulation produced, for the results layer to report."""

    scenario: Scenario
    layout: Layout
    schedule: Schedule
    workload: Workload
    costs: dict[tuple[int, str], ActionCost]
    timeline: Timeline


def plan_schedule(scenario: Scenario, layout: Layout, base_dir: Path | None = None) -> Schedule:
    """The validated schedule of the plan; problems are reported against parallel.schedule."""
    try:
        return build_schedule(scenario.parallel.schedule, layout.pp, layout.vpp, layout.num_microbatches, base_dir)
    except ScheduleError as exc:
        raise InputError(str(exc), field="parallel.schedule") from None


def engine_input(scenario: Scenario, layout: Layout, workload: Workload, schedule: Schedule, model: CostModel,
                 costs: dict[tuple[int, str], ActionCost]) -> EngineInput:
    """The engine's plain-number input for one step."""
    rank_of = schedule.stage_to_rank
    transfer: dict[tuple[int, int], float] = {}
    for stage in range(schedule.num_stages - 1):
        seconds = pipeline_transfer_s(workload, model, rank_of[stage], rank_of[stage + 1])
        transfer[(stage, stage + 1)] = transfer[(stage + 1, stage)] = seconds
    buckets = {stage: tuple(GradBucket(*bucket) for bucket in grad_buckets(work.params, model))
               for stage, work in enumerate(workload.stages)}
    params_per_rank = [0.0] * schedule.num_ranks
    for stage, work in enumerate(workload.stages):
        params_per_rank[rank_of[stage]] += work.params
    first, last = rank_of[0], rank_of[-1]
    pair_syncs: tuple[tuple[int, int, float, str], ...] = ()
    if scenario.model.tied_embeddings and first != last:
        pair_syncs = ((first, last, tied_embedding_sync_s(workload, model, first, last),
                       "tied embedding grad all-reduce"),)
    return EngineInput(
        schedule=schedule,
        action_s={key: cost.duration_s for key, cost in costs.items()},
        transfer_s=transfer,
        grad_buckets=buckets,
        overlap_grad_sync=scenario.training.overlap_grad_reduce,
        pair_syncs=pair_syncs,
        finalize_s=tuple(optimizer_s(params, model) for params in params_per_rank),
        send_blocking=scenario.training.pp_send_blocking,
    )


def simulate(scenario: Scenario, base_dir: Path | None = None) -> SimulationResult:
    """Simulate one training step of ``scenario``."""
    layout = resolve_layout(scenario)
    schedule = plan_schedule(scenario, layout, base_dir)
    workload = build_workload(scenario, layout)
    model = CostModel(scenario, layout)
    costs = stage_costs(workload, model)
    timeline = run_engine(engine_input(scenario, layout, workload, schedule, model, costs))
    return SimulationResult(scenario, layout, schedule, workload, costs, timeline)
