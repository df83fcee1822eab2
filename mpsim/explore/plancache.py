"""What the planner keeps between the layouts one worker evaluates.

A plan prices thousands of layouts that share most of their work. Layouts that differ only
in their schedule share a scenario, layout, workload and cost model (``Prepared``, built
lazily: most layouts of a large plan are settled by a memory check that needs no prices);
groups that differ only in a ZeRO stage below 3 also share the workload, since those stages
shard optimizer state and gradients and change no op.
Layouts with the same schedule, pipeline depth, virtual stages and microbatch count share
the schedule's short forms (``Short``). Every memory check is remembered by its exact
fields, and collectives, sends and group placements by their exact inputs
(``collectives.remembering``, ``topology.place_ranks``); a pass priced by one group's cost
model serves every other model that would price it alike (``cost.shared_prices.sharing``).

The caches change how often a thing is computed, never what: every key holds all of the
inputs that the remembered answer reads, and ``clear_caches`` returns a process to a
state where everything is computed afresh (the tests compare both).

What is kept is kept lean, because Python's cycle collector walks every container a
process holds on each full collection, and a plan's allocations trigger dozens: a full
schedule is let go once its short forms are made (the memory walk as arrays, not action
tuples), and only the layout groups of the chunk at hand stay prepared. Keeping every
generated schedule and a few hundred groups once cost a plan more time in the collector
than in its memory checks.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from mpsim.cost.actions import CostModel, stage_costs
from mpsim.cost.step import pipeline_transfer_s
from mpsim.engine.core import cyclic_gc_paused
from mpsim.explore.bounds import rank_counts, rank_counts_of_read
from mpsim.explore.evaluate import schedule_for
from mpsim.explore.memfast import LayoutMemory, ShortWalk
from mpsim.explore.memwalk import ScheduleRead, distinct_items, distinct_of_read, item_keys
from mpsim.schedules import Schedule
from mpsim.simulate import optimizer_steps, schedule_costs, stage_grad_buckets
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload import Workload, build_workload

# layout groups, each with its workload and priced costs: a check chunk's groups (SP x ZeRO x
# recompute, 12 by default) and a few more. The check pass takes its layouts chunk by chunk, so
# more would only keep groups it is done with, for the cycle collector to walk again and again
PREPARED_ENTRIES = 16
WORKLOAD_ENTRIES = 16  # a workload serves the layout groups that differ from it only below ZeRO-3
SHORT_ENTRIES = 4096  # small: a few hundred items each, where full schedules hold up to a million
MEMORY_ENTRIES = 16384  # four numbers each


class Prepared:
    """What layouts differing only in their schedule share: scenario, layout, workload, priced costs.

    The workload, cost model and memory check are built on first use: most layouts of a large
    plan are settled by a memory check that needs no prices, and many by one that a
    layout differing only in recompute already made.
    """

    def __init__(self, scenario: Scenario, layout: Layout, workload_key: Any = None):
        self.scenario, self.layout = scenario, layout
        # layouts whose stages are alike (below ZeRO-3 the stage does not change a stage's ops)
        # share one workload under this key (None: this group's own)
        self.workload_key = workload_key
        self._workload: Workload | None = None
        self._model: CostModel | None = None
        self._memory: LayoutMemory | None = None
        self.costs: dict = {}  # schedule name -> (duration key -> ActionCost), filled as schedules ask
        self.stage_costs: dict = {}  # stage_to_rank -> ((stage, kind) -> ActionCost): shared by its schedules
        self.placed: dict = {}  # (stage_to_rank, chains) -> placed_inputs
        self._scenarios: dict[str, Scenario] = {scenario.parallel.schedule: scenario}  # by schedule name

    def with_schedule(self, name: str) -> Scenario:
        """The group's validated scenario with schedule ``name``: only that name differs."""
        found = self._scenarios.get(name)
        if found is None:
            plan = self.scenario.parallel.model_copy(update={"schedule": name})
            found = self._scenarios[name] = self.scenario.model_copy(update={"parallel": plan})
        return found

    @property
    def workload(self) -> Workload:
        if self._workload is None:
            shared = None if self.workload_key is None else WORKLOADS.get(self.workload_key)
            if shared is None:
                shared = build_workload(self.scenario, self.layout)
                if self.workload_key is not None:
                    remember(WORKLOADS, self.workload_key, shared)
            self._workload = shared
        return self._workload

    @property
    def model(self) -> CostModel:
        # the cost model prices passes once per model object; sharing it shares that work
        if self._model is None:
            self._model = CostModel(self.scenario, self.layout)
        return self._model

    def schedule_costs(self, schedule: Schedule, distinct: bool = False) -> dict:
        """The schedule's costs, priced once per schedule name (``distinct``: the schedule has one
        item per duration key already): a stage's passes cost the same whatever order a schedule
        runs them in, so schedules that place the stages alike share their prices."""
        costs = self.costs.get(schedule.name)
        if costs is None:
            placed = schedule.stage_to_rank
            stages = self.stage_costs.get(placed)
            if stages is None:
                stages = self.stage_costs[placed] = stage_costs(self.workload, self.model, placed)
            costs = self.costs[schedule.name] = schedule_costs(
                schedule if distinct else distinct_items(schedule), self.workload, self.model, stages)
        return costs

    def placed_inputs(self, schedule: Schedule) -> tuple[dict, tuple[float, ...], dict]:
        """The pipeline transfers (both ways over each cut of a chain), optimizer steps and final DP
        buckets of the engine input: they depend on where the stages are, not on the order a
        schedule runs them in, so schedules that place the stages alike share them."""
        key = (schedule.stage_to_rank, schedule.chains)
        found = self.placed.get(key)
        if found is None:
            workload, model = self.workload, self.model
            rank_of, chains = schedule.stage_to_rank, schedule.topology
            hops = [(before, s) for s in range(schedule.num_stages) if (before := chains.previous(s)) is not None]
            transfer = {(a, b): pipeline_transfer_s(workload, model, rank_of[a], rank_of[b], a) for a, b in hops}
            transfer.update({(b, a): seconds for (a, b), seconds in list(transfer.items())})
            found = self.placed[key] = (transfer, optimizer_steps(workload, schedule, model),
                                        stage_grad_buckets(workload, schedule, model))
        return found

    @property
    def memory(self) -> LayoutMemory:
        """The memory check of this layout, for any schedule (memfast.py)."""
        if self._memory is None:
            self._memory = LayoutMemory(self.scenario, self.layout, self.workload)
        return self._memory


@dataclass(frozen=True)
class Short:
    """What the check pass needs of a generated schedule, without its full lists: the same lists
    with no actions (model state alone), the memory walk's shortened lists (``memwalk.py``) read
    into arrays (``memfast.ShortWalk``), one item per duration key, and per rank its first item
    and item counts (the bound)."""

    idle: Schedule
    memory: ShortWalk
    distinct: Any
    counts: list


PREPARED: OrderedDict[tuple, Prepared] = OrderedDict()
WORKLOADS: OrderedDict[tuple, Workload] = OrderedDict()
SHORTS: OrderedDict[tuple, Short] = OrderedDict()
MEMORY: OrderedDict[tuple, tuple[float, float, str, bool]] = OrderedDict()
COLLECTIVES: dict = {}  # collectives.choose_algorithm's answers in this process (keyed on exact inputs)
PRICES: dict = {}  # passes priced in this process, shared by cost models (cost.shared_prices)
_LIMITS = {id(PREPARED): PREPARED_ENTRIES, id(WORKLOADS): WORKLOAD_ENTRIES, id(SHORTS): SHORT_ENTRIES,
           id(MEMORY): MEMORY_ENTRIES}


def remember(cache: OrderedDict, key: Any, value: Any) -> Any:
    """Keep ``value`` under ``key``, forgetting the oldest entry past the cache's limit."""
    cache[key] = value
    if len(cache) > _LIMITS[id(cache)]:
        cache.popitem(last=False)
    return value


def clear_caches() -> None:
    """Forget every layout, schedule, memory check, collective and placement this process has kept."""
    from mpsim.cost import topology

    for cache in (PREPARED, WORKLOADS, SHORTS, MEMORY, COLLECTIVES, PRICES, topology._PLACED):
        cache.clear()


def short_schedule(scenario: Scenario, layout: Layout) -> Short:
    """The layout's schedule in its short forms, kept per (name, pp, vpp, microbatches, group size, pairing); a
    schedule read from a file is generated afresh each time (the file may change)."""
    name = scenario.parallel.schedule
    from_file = name.startswith("file:")
    training = scenario.training
    # the deferral rewrites the head stage's actions: a schedule with it is another schedule
    deferral = training.wgrad_deferral_limit if training.defer_embedding_wgrad else None
    # a walk that tracks gathered parameters keeps every state (memfast.LayoutMemory.fullest)
    whole_walk = layout.fsdp_gathering is not None
    key = (name, layout.pp, layout.vpp, layout.num_microbatches, layout.microbatch_group_size, layout.combined_1f1b,
           deferral, whole_walk)
    short = None if from_file else SHORTS.get(key)
    if short is None:
        # a schedule of up to a million actions is made and shortened at once; all but the
        # short forms die together when it is let go, holding no cycles
        with cyclic_gc_paused():
            schedule = schedule_for(scenario, layout, None, cached=False)
            read = ScheduleRead.of(schedule)  # once, for the walk and, without overlapped pairs, the rest
            walk = ShortWalk.of(schedule, shorten=not whole_walk, read=read)
            if read.plain:
                distinct, counts = distinct_of_read(schedule, read), rank_counts_of_read(schedule, read)
            else:
                keys = [item_keys(items) for items in schedule.actions]
                distinct, counts = distinct_items(schedule, keys), rank_counts(schedule, keys)
            short = Short(replace(schedule, actions=tuple(() for _ in schedule.actions)), walk, distinct, counts)
            del schedule, read
        if not from_file:
            remember(SHORTS, key, short)
    return short
