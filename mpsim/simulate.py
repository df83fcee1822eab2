"""The main path, top to bottom: scenario -> layout -> schedule -> workload -> costs -> engine.

Each step is a plain function of plain data from the layer below (see
docs/architecture.md); this module only wires them together in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

from mpsim.cost.actions import ActionCost, CostModel, stage_costs
from mpsim.cost.chunk_gathers import window_gathers
from mpsim.cost.contention import group_sm_share
from mpsim.cost.pairs import EXPERT_DISPATCH_GROUPS, overlapped_cost
from mpsim.cost.step import (final_grad_buckets, group_links, microbatch_grad_buckets, optimizer_s,
                             param_gather_exposed_s, pipeline_transfer_s, pipeline_transfer_spec,
                             tied_embedding_sync_s)
from mpsim.engine import EngineInput, GradBucket, Timeline, rank_spans, simulate as run_engine, simulate_fast, supports
from mpsim.engine.consecutive import steady_period
from mpsim.engine.core import TransferSpec, duration_key
from mpsim.engine.excise import cut_out, simulate_excised
from mpsim.engine.timeline import ROUNDING
from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.schedules import Schedule, ScheduleError, build_schedule, is_searched, search_outline
from mpsim.schedules.actions import Overlapped
from mpsim.schedules.deferral import defer_head_weight_grads
from mpsim.schedules.unshard import mark_unsharding
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


def plan_schedule(scenario: Scenario, layout: Layout, base_dir: Path | None = None,
                  outline_searched: bool = False) -> Schedule:
    """The validated schedule of the plan as it runs (the LM head's weight gradients deferred
    where ``training.defer_embedding_wgrad`` says so); problems are reported against
    parallel.schedule, or against the deferral where it cannot split the head's backward.

    ``outline_searched``: a searched schedule (zb-1p, zb-2p) as its frame only, for a caller
    that searches it next with the priced stage times (:func:`searched_schedule`).
    """
    name, training = scenario.parallel.schedule, scenario.training
    try:
        if outline_searched and is_searched(name):
            schedule = search_outline(name, layout.pp, layout.vpp, layout.num_microbatches)
        else:
            schedule = build_schedule(name, layout.pp, layout.vpp, layout.num_microbatches, base_dir,
                                      timer=rank_spans, microbatch_group_size=layout.microbatch_group_size,
                                      combined=layout.combined_1f1b)
    except ScheduleError as exc:
        raise InputError(str(exc), field="parallel.schedule") from None
    if not training.defer_embedding_wgrad:
        return schedule
    try:
        return defer_head_weight_grads(schedule, training.wgrad_deferral_limit)
    except ValueError as exc:
        raise InputError(str(exc), field="training.defer_embedding_wgrad") from None


def searched_schedule(schedule: Schedule, workload: Workload, model: CostModel) -> Schedule:
    """A searched schedule (zb-1p, zb-2p) found again for this scenario's stage and transfer times.

    The registry builds it with unit times (all a name and a layout give); the search
    needs the priced forward, input-gradient and weight-gradient times of every stage.
    """
    costs = stage_costs(workload, model, schedule.stage_to_rank)
    stages = range(schedule.num_stages)
    rank_of = schedule.stage_to_rank
    transfer_s = max((pipeline_transfer_s(workload, model.between(rank_of[s], rank_of[s + 1]), rank_of[s],
                                          rank_of[s + 1], s) for s in stages[:-1]), default=0.0)
    # the memory a forward holds and a pending weight gradient keeps, which the search's limit counts
    times = StageTimes(tuple(costs[(s, "F")].duration_s for s in stages),
                       tuple(costs[(s, "I")].duration_s for s in stages),
                       tuple(costs[(s, "W")].duration_s for s in stages), transfer_s,
                       tuple(workload.stages[s].activation_bytes for s in stages),
                       tuple(workload.stages[s].weight_grad_buffer_bytes for s in stages))
    try:
        return SEARCHED[schedule.name](times, schedule.num_microbatches, rank_spans)
    except ValueError as exc:  # what the registry's search with unit times reports as a ScheduleError
        raise InputError(str(exc), field="parallel.schedule") from None


def engine_input(scenario: Scenario, layout: Layout, workload: Workload, schedule: Schedule, model: CostModel,
                 costs: dict[tuple[int, str], ActionCost]) -> EngineInput:
    """The engine's plain-number input for one step."""
    contention = scenario.training.network_contention
    transfer_s, transfer_links = pipeline_transfers(workload, schedule, model, contention)
    buckets = _BucketMaker(model, transfer_links)
    copies = block_copy_ranks(schedule)
    return EngineInput(
        schedule=schedule,
        action_s={key: cost.duration_s for key, cost in costs.items()},
        transfer_s=transfer_s,
        grad_buckets=final_reductions(workload, schedule, model, copies, buckets),
        overlap_grad_sync=scenario.training.overlap_grad_reduce,
        pair_syncs=pair_syncs(scenario, workload, schedule, model, copies),
        finalize_s=optimizer_steps(workload, schedule, model),
        action_buckets=action_reductions(workload, schedule, model, costs, copies, buckets),
        send_blocking=bool(scenario.training.pp_send_blocking),
        send_blocking_with_receive=scenario.training.pp_send_blocking == "with-receive",
        transfer_links=transfer_links if contention else None,
        optimizer_chain=scenario.training.optimizer_post_validation,
        optimizer_barrier=optimizer_waits_for_all(scenario),
        gathered_after=window_gathers(schedule, workload, model, layout.fsdp_gathering),
    )


def optimizer_waits_for_all(scenario: Scenario) -> bool:
    """Whether no rank updates before every pipeline rank's gradients are ready: the global
    gradient norm (``training.clip_grad``) and fp16's inf/nan flag are all-reduced over every
    rank holding distinct gradients, the pipeline's included, and the update waits for them
    (``cost/step.py``, ``grad_checks_s``), unless post-validation checks them afterwards."""
    training = scenario.training
    return (training.clip_grad or training.dtype == "fp16") and not training.optimizer_post_validation


def pipeline_transfers(workload: Workload, schedule: Schedule, model: CostModel, contention: bool
                       ) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], TransferSpec]]:
    """Seconds of each pipeline send between neighbouring stages (both ways), and with
    ``contention`` the links each send between two ranks loads."""
    rank_of, chains = schedule.stage_to_rank, schedule.topology
    transfer: dict[tuple[int, int], float] = {}
    links: dict[tuple[int, int], TransferSpec] = {}
    for stage in range(schedule.num_stages):
        after = chains.next(stage)  # pipeline links join the stages of a chain only
        if after is None:
            continue
        a, b = rank_of[stage], rank_of[after]
        pair = model.between(a, b)  # the slower side's links; across parts, the network between them
        transfer[(stage, after)] = transfer[(after, stage)] = pipeline_transfer_s(workload, pair, a, b, stage)
        if contention and a != b:
            links[(stage, after)] = TransferSpec(*pipeline_transfer_spec(workload, pair, a, b, stage))
            links[(after, stage)] = TransferSpec(*pipeline_transfer_spec(workload, pair, b, a, stage))
    return transfer, links


class _BucketMaker:
    """Gradient buckets for the engine, each with the links it shares with pipeline sends.

    A bucket only needs the links that some pipeline transfer also loads (the engine
    shares bandwidth only where two flows meet); without contention there are none.
    """

    def __init__(self, model: CostModel, transfer_links: dict[tuple[int, int], TransferSpec]):
        self.model = model
        self.busy_links = {link for spec in transfer_links.values() for link in spec.links}
        self.shared: dict[tuple, tuple] = {}  # (group, rank) -> its links that transfers load too

    def __call__(self, spec: tuple, rank: int) -> GradBucket:
        ready, seconds, label, group = spec
        links = ()
        if self.busy_links:
            links = self.shared.get((group, rank))
            if links is None:
                links = self.shared[(group, rank)] = tuple(
                    link for link in group_links(self.model, group, rank) if link in self.busy_links)
        return GradBucket(ready, seconds, label, links)


def final_reductions(workload: Workload, schedule: Schedule, model: CostModel, copies: list[tuple[int, ...]],
                     bucket: _BucketMaker) -> dict[int, tuple[GradBucket, ...]]:
    """Per stage, the gradient buckets its last backward fills (reduced over DP, and over block copies).

    As Megatron-Core does, only the first model chunk of pipeline rank 0 (stage 0) is split
    into buckets; every other stage reduces its gradients as one bucket (``cost/step.py``).
    """
    # stages of equal work (one object) on one device have the same reductions, and on one rank
    # the same links too
    specs: dict[tuple, tuple] = {}
    made: dict[tuple, tuple[GradBucket, ...]] = {}
    buckets = {}
    for stage, work in enumerate(workload.stages):
        rank = schedule.stage_to_rank[stage]
        here = model.on_rank(rank)
        key = (id(work), copies[stage], stage == 0, id(here))
        found = made.get((key, rank))
        if found is None:
            spec = specs.get(key)
            if spec is None:
                spec = specs[key] = final_grad_buckets(work, here, copies[stage], bucketed=stage == 0)
            found = made[(key, rank)] = tuple(bucket(one, rank) for one in spec)
        buckets[stage] = found
    return buckets


def stage_grad_buckets(workload: Workload, schedule: Schedule, model: CostModel) -> dict[int, tuple[GradBucket, ...]]:
    """``final_reductions`` with no link shared with pipeline sends: their durations alone, as
    the planner's lower bound reads them (``explore/bounds.py``)."""
    return final_reductions(workload, schedule, model, block_copy_ranks(schedule), _BucketMaker(model, {}))


def action_reductions(workload: Workload, schedule: Schedule, model: CostModel, costs: dict[tuple, ActionCost],
                      copies: list[tuple[int, ...]], bucket: _BucketMaker) -> dict[tuple, tuple[GradBucket, ...]]:
    """Reductions some actions start on the DP stream each time they run: ZeRO-3's per-layer
    scatters (in the action's cost) and ZeRO-2's per-microbatch gradient scatter."""
    found: dict[tuple, tuple[GradBucket, ...]] = {}
    for key, cost in costs.items():
        stage, rank = key[0], schedule.stage_to_rank[key[0]]  # every action of a (stage, kind) runs on one rank
        per_action = [(*spec, "zero") for spec in cost.async_dp]
        if key[1] in ("B", "W") and len(key) == 2:
            per_action += microbatch_grad_buckets(workload.stages[stage], model.on_rank(rank), copies[stage])
        if per_action:
            found[key] = tuple(bucket(spec, rank) for spec in per_action)
    return found


def optimizer_steps(workload: Workload, schedule: Schedule, model: CostModel) -> tuple[float, ...]:
    """Seconds of each pipeline rank's optimizer step over the stages it holds.

    With ``training.overlap_param_gather`` (ZeRO-1/2) the parameter all-gather is not part of
    the step; what the next step's first forwards cannot hide of it is added instead
    (``overlapped_param_gather_s``).
    """
    works_per_rank: list[list] = [[] for _ in range(schedule.num_ranks)]
    for stage, work in enumerate(workload.stages):
        works_per_rank[schedule.stage_to_rank[stage]].append(work)
    exposed = overlapped_param_gather_s(workload, schedule, model)
    return tuple(optimizer_s(works, model.on_rank(rank)) + exposed for rank, works in enumerate(works_per_rank))


def overlapped_param_gather_s(workload: Workload, schedule: Schedule, model: CostModel) -> float:
    """Seconds by which the parameter all-gather overlapped with the forward lengthens the step.

    Each rank waits for the gather before its first model chunk's first forward
    (``cost.step.param_gather_exposed_s``; the chunks after the first are gathered ahead
    while the first ones run). Megatron-Core buckets pipeline rank 0's first chunk only, and
    aligns the dispatch at the start of the step on every rank with interleaved schedules
    (``align_param_gather``, on by default there; off without interleaving, when each rank
    dispatches at its first forward). A rank's wait delays its first forward and with it
    every later stage's and the backwards that come back, so the step grows by the sum
    of the ranks' waits; it is added to every rank's optimizer step.
    """
    layout, training = model.layout, model.scenario.training
    # FSDP under torch.distributed.pipelining gathers each chunk unit by unit, dispatched at the
    # start of the rank's list: its schedules open with UNSHARD actions for the first stages they
    # compute (_add_unshard_reshard in torch/distributed/pipelining/schedules.py)
    fsdp = layout.fsdp_pipelined
    if not fsdp and (not training.overlap_param_gather or layout.zero_stage not in (1, 2)):
        return 0.0
    aligned = layout.vpp > 1 or fsdp
    chains = schedule.topology
    total = 0.0
    for rank in range(schedule.num_ranks):
        stages = [s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank]
        if not stages:
            continue
        first = min(stages)
        work = workload.stages[first]
        here = model.on_rank(rank)
        forward_s = here.price(work.forward).duration_s
        head = 0.0
        before = chains.previous(first)
        while before is not None:  # the forwards of the chain before it: the earliest its input can come
            head += model.on_rank(schedule.stage_to_rank[before]).price(workload.stages[before].forward).duration_s
            before = chains.previous(before)
        total += param_gather_exposed_s(work, here, forward_s, bucketed=first == 0, aligned=aligned, head_s=head,
                                        per_layer=fsdp)
    return total


def pair_syncs(scenario: Scenario, workload: Workload, schedule: Schedule, model: CostModel,
               copies: list[tuple[int, ...]]) -> tuple[tuple[int, int, float, str], ...]:
    """Reductions two pipeline ranks must both reach before either's optimizer step."""
    first, last = schedule.stage_to_rank[0], schedule.stage_to_rank[-1]
    syncs: tuple[tuple[int, int, float, str], ...] = ()
    if scenario.model.tied_embeddings and first != last:
        syncs = ((first, last, tied_embedding_sync_s(workload, model.between(first, last), first, last),
                  "tied embedding grad all-reduce"),)
    # ranks sharing copies of a block reduce its gradients in one collective, which ends
    # only when both have produced them: neither rank's optimizer starts before the other's
    joined = sorted({(min(ranks), max(ranks)) for ranks in copies if len(ranks) == 2})
    return syncs + tuple((a, b, 0.0, "block copies' gradients reduced together") for a, b in joined)


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


def schedule_costs(schedule: Schedule, workload: Workload, model: CostModel,
                   stages: dict[tuple[int, str], ActionCost] | None = None) -> dict[tuple, ActionCost]:
    """Costs of every (stage, kind), plus every forward+backward pair the schedule runs (overlapped
    only when ``training.overlap_paired_passes`` says the framework does it, or the pairs are
    Megatron-Core's combined 1F1B, which overlaps their expert all-to-alls). ``stages``: the
    ``stage_costs`` of the schedule's placement, where the caller kept them."""
    if stages is None:
        stages = stage_costs(workload, model, schedule.stage_to_rank)
    costs: dict[tuple, ActionCost] = dict(stages)
    training = model.scenario.training
    # Megatron-Core's combined 1F1B always overlaps its pairs, and only their expert all-to-alls
    combined = training.overlap_moe_expert_parallel_comm
    for actions in schedule.actions:
        for item in actions:
            if isinstance(item, Overlapped):
                key = duration_key(item)
                if key not in costs:
                    costs[key] = overlapped_cost(costs[duration_key(item.forward)], costs[duration_key(item.backward)],
                                                 overlap=training.overlap_paired_passes or combined,
                                                 sm_share=partial(group_sm_share, training, model.system),
                                                 hides=EXPERT_DISPATCH_GROUPS if combined else None)
    return costs


def simulate(scenario: Scenario, base_dir: Path | None = None, *,
             engine: Callable[[EngineInput], Timeline] = simulate_excised, layout: Layout | None = None,
             schedule: Schedule | None = None) -> SimulationResult:
    """Simulate one training step of ``scenario``.

    ``engine`` runs the step (the SimPy engine, its exactly repeated middle run once:
    ``engine/excise.py``; a sweep may pass a faster evaluator of the same input, a check the
    engine over every action); a caller that already resolved the layout or built the
    schedule passes them, the schedule as it runs (``training.defer_embedding_wgrad``
    applied, as :func:`plan_schedule` and ``mpsim.explore.evaluate.schedule_for`` build it).
    """
    layout = layout or resolve(scenario)
    schedule = schedule or plan_schedule(scenario, layout, base_dir, outline_searched=True)
    if schedule.chains != layout.chains:
        # a schedule file that names several pipelines: the layers split into blocks per chain
        layout = resolve(scenario, chains=schedule.chains)
    workload = build_workload(scenario, layout)
    model = CostModel(scenario, layout)
    if schedule.name in SEARCHED:
        schedule = searched_schedule(schedule, workload, model)
    if layout.fsdp_gathering is not None:  # the passes that gather their chunk's parameters first
        schedule = mark_unsharding(schedule, layout.fsdp_gathering)
    costs = schedule_costs(schedule, workload, model)
    inp = engine_input(scenario, layout, workload, schedule, model, costs)
    timeline = overlap_steps(scenario, inp, engine(inp))
    return SimulationResult(scenario, layout, schedule, workload, costs, timeline, inp)


def overlap_steps(scenario: Scenario, inp: EngineInput, timeline: Timeline) -> Timeline:
    """``timeline`` (one step of ``inp``) with the period of a long run as its step time where
    ``training.optimizer_post_validation`` lets steps overlap (``engine/consecutive.py``); the
    records stay the one step's."""
    if scenario.training.optimizer_post_validation:
        timeline.steady_period_s = steady_period(inp, first=timeline).period_s
    return timeline


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


def bubble_reference(result: SimulationResult, cut: bool = True) -> BubbleReference:
    """Re-run the step with balanced stages and free pipeline communication (``cut``: its
    repeated middle run once, its waits repeated)."""
    inp = result.engine_input
    by_kind: dict[tuple, list[float]] = {}
    for key, seconds in inp.action_s.items():
        by_kind.setdefault(key[1::2], []).append(seconds)  # ("F",), ("B",), ("F", "B") for pairs
    mean = {kind: sum(values) / len(values) for kind, values in by_kind.items()}
    balanced = replace(inp, action_s={key: mean[key[1::2]] for key in inp.action_s},
                       transfer_s={key: 0.0 for key in inp.transfer_s}, send_blocking=False, grad_buckets={},
                       pair_syncs=(), finalize_s=(), action_buckets={}, transfer_links=None, gathered_after={})
    # nothing shared, one writer per resource: the longest path gives the engine's timeline, in
    # a third of its time (the walk, not the compiled loop: one run does not repay compiling);
    # its repeated middle is run once, and its waits repeated (engine/excise.py)
    repeat = cut_out(balanced) if cut and supports(balanced) else None
    if repeat is not None:
        balanced = replace(balanced, schedule=repeat.short(balanced.schedule))
    timeline = simulate_fast(balanced) if supports(balanced) else run_engine(balanced)
    end = timeline.pipeline_end_s
    noise_s = ROUNDING * end  # a wait within rounding of the step's times is none
    waits = []
    for rank, records in enumerate(timeline.actions):
        ready = [0.0] + [r.end_s for r in records[:-1]]
        rank_waits = [wait if wait > noise_s else 0.0 for wait in
                      (r.start_s - before for r, before in zip(records, ready))]
        waits.append(tuple(rank_waits if repeat is None else repeat.per_item(rank, rank_waits)))
    return BubbleReference(tuple(waits), tuple(end - (r[-1].end_s if r else 0.0) for r in timeline.actions))
