"""``parallel.layers_per_stage: auto``: price every layer, then split the model with :mod:`partition`.

Each pipeline unit (a transformer layer; a top-level layer or block repetition of a
stack) is built as a one-unit stage and priced by the real cost model: its forward and
backward seconds on one rank (under FSDP resharding after the forward in a pipeline, the
backward that gathers the unit's parameters: one gather per microbatch), the seconds to
send its output to the next stage, its model-state bytes after ZeRO sharding (with FSDP
resharding after the forward in a pipeline, plus what its parameters gathered whole, which
a backward keeps, add beyond a microbatch's activations), its activation bytes per
microbatch and what a split backward keeps for its weight gradient. The schedule says
how many microbatches each stage keeps in flight at its peak (1F1B: ``p`` on the first
stage, 1 on the last), which is what makes the memory budget differ by stage, and how
many input gradients wait for their weight gradient at most. A transformer's embedding
and LM head are fixed extras of the first and last stage.

The budget is the device's capacity less the reserved memory (each part of a mixed
cluster its own, ``workload.memory.reserved_parts``), fragmentation and the communication
buffers at a peak (``workload.memory.transient_buffers_bytes``), shared evenly by a
rank's ``vpp`` chunks, each part of a stage counted at its own peak. The split the
dynamic program finds is then walked rank by rank over the passes of the schedule the
run takes (:func:`balanced_layers`): zb-1p and zb-2p are searched again with the split's
priced times, as the run does, and may hold more than the unit-time search the budget
read, and a rank's chunks may share its memory unevenly, which the even share refuses.
Under ``recompute_num_layers``, which recomputes only a chunk's first layers, each unit
is priced both ways and a stage's first layers count as recomputed (docs/models.md).
When no split fits, the fastest split is returned and the memory report shows what
overflows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from mpsim.balance.partition import (PartitionProblem, RankPasses, balance, bottleneck_s, counts_to_cuts, fits_ranks,
                                     rank_peak_bytes, stage_bytes, stage_sums)
from mpsim.cost.actions import CostModel
from mpsim.cost.collectives import p2p_time
from mpsim.cost.topology import pipeline_neighbours_share_node
from mpsim.engine import rank_spans
from mpsim.schedules import SEARCHED, Schedule, build_schedule, canonical_name, flat, is_searched
from mpsim.schedules.zb_list import StageTimes
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.specs.stack import LayerStackSpec
from mpsim.workload.memory import (gathered_params_bytes, model_state_bytes, model_state_options, reserved_parts,
                                   transient_buffers_bytes)
from mpsim.workload.stage_work import StageWork


def _schedule(scenario: Scenario, layout: Layout) -> Schedule | None:
    """The layout's schedule, the LM head's weight gradients deferred where the run defers them
    (``simulate.plan_schedule``'s rule), or None where it cannot be built here (a schedule file
    the layout check reports later)."""
    try:
        schedule = build_schedule(scenario.parallel.schedule, layout.pp, layout.vpp, layout.num_microbatches,
                                  timer=rank_spans, microbatch_group_size=layout.microbatch_group_size,
                                  combined=layout.combined_1f1b)
        if scenario.training.defer_embedding_wgrad:
            from mpsim.schedules.deferral import defer_head_weight_grads

            schedule = defer_head_weight_grads(schedule, scenario.training.wgrad_deferral_limit)
        return schedule
    except Exception:
        return None


def _peak_per_stage(schedule: Schedule, num_stages: int, opens: str, closes: tuple[str, ...]) -> list[int]:
    """The most passes of kind ``opens`` each stage has not yet matched by one of ``closes``, at
    any point of its rank's list."""
    peak = [0] * num_stages
    for actions in schedule.actions:
        held = [0] * num_stages
        for stage, kind, _ in flat(actions):
            held[stage] += 1 if kind == opens else -1 if kind in closes else 0
            peak[stage] = max(peak[stage], held[stage])
    return peak


def in_flight_per_stage(scenario: Scenario, layout: Layout, schedule: Schedule | None = None) -> tuple[int, ...]:
    """Peak microbatches each stage holds between its forward and its backward, from the schedule
    (built here when not given; 1F1B's warm-up where it cannot be built)."""
    schedule = schedule or _schedule(scenario, layout)
    if schedule is None:
        return tuple(min(layout.num_microbatches, layout.pp - s % layout.pp) for s in range(layout.num_stages))
    return tuple(max(1, n) for n in _peak_per_stage(schedule, layout.num_stages, "F", ("B", "I")))


def _state_bytes(scenario: Scenario, layout: Layout, work: StageWork) -> float:
    """Weights, gradients and optimizer state of a stage's parameters on one rank.

    Under FSDP resharding after the forward in a pipeline (``Layout.fsdp_unsharding``) also
    what the stage's parameters gathered whole add beyond one microbatch's activations: a
    chunk holds them from the step's start to its first forward and from a backward to its
    next forward (``results.memory.walk_peak``), and a backward has just freed one of the
    microbatches its stage holds at most, so the chunk's activations and parameters stay
    within its peak microbatches' activations plus that excess. Counted per unit, the
    excess is a bound of the chunk's. Where a chunk window gathers whole chunks between the
    passes instead (``Layout.fsdp_windowed`` without ``reshard_after_forward``), the stage's
    parameters gathered whole: every chunk's, a bound of the window's.
    """
    kwargs = model_state_options(scenario, layout)
    if layout.fsdp_unsharding:
        gathered = max(0.0, gathered_params_bytes(work) - work.activation_bytes)
    else:
        gathered = gathered_params_bytes(work) if layout.fsdp_windowed else 0.0
    return (model_state_bytes(work.params, shard=layout.shard_ranks, **kwargs).total_bytes
            + model_state_bytes(work.expert_params, shard=layout.expert_dp, **kwargs).total_bytes + gathered)


def pending_weight_grads_per_stage(layout: Layout, schedule: Schedule | None) -> tuple[int, ...]:
    """The most input-gradient passes of each stage waiting for their weight-gradient pass at
    once (zero-bubble schedules), from the schedule; none where it cannot be built."""
    if schedule is None:
        return (0,) * layout.num_stages
    return tuple(_peak_per_stage(schedule, layout.num_stages, "I", ("W",)))


def _transient_bytes(scenario: Scenario, layout: Layout, works: list[StageWork]) -> float:
    """The communication buffers the memory table adds at a rank's peak (``transient_buffers_bytes``),
    for the largest layer of the model."""
    if isinstance(scenario.model, LayerStackSpec):
        from mpsim.workload.layer_stack import stack_env, widest_context

        context = widest_context(scenario.model, stack_env(scenario, layout))
    else:
        from mpsim.workload.stages import layer_context

        context = layer_context(scenario, layout)
    largest = max((work.largest_layer_params for work in works), default=0.0)
    return transient_buffers_bytes(largest, context.activation_message, layout)


def _unit_stages(scenario: Scenario, layout: Layout, unsharding: bool = False, keeping: bool = False
                 ) -> tuple[list[StageWork], list[float], StageWork | None, StageWork | None, list[bool]]:
    """(one-unit stages, bytes a cut after each unit sends, first-stage extra, last-stage extra,
    which units are layers that recompute may apply to); ``unsharding``: each pass gathering its
    parameters first (``Workload.unsharding``); ``keeping``: every layer keeping its activations
    (what ``recompute_num_layers`` leaves past a chunk's first layers)."""
    scatter = scenario.training.pp_scatter_gather or layout.sequence_parallel
    if isinstance(scenario.model, LayerStackSpec):
        from mpsim.workload.layer_stack import build_stack_stage, stack_env, stack_options, unit_works

        options = stack_options(scenario, layout, unsharding)
        options = replace(options, recompute_layers=0) if keeping else options
        units = unit_works(scenario.model, stack_env(scenario, layout))
        stages = [build_stack_stage((unit,), options) for unit in units]
        sends = [unit.output_bytes / (layout.tp if scatter else 1) for unit in units]
        return stages, sends, None, None, [unit.is_layer for unit in units]
    from mpsim.workload.embedding import padded_vocab
    from mpsim.workload.stages import build_stage, layer_context, stage_options

    ctx = layer_context(scenario, layout)
    options = stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp), unsharding)
    options = replace(options, recompute_layers=0) if keeping else options
    model = scenario.model
    dense_layers = model.moe.dense_layers if model.moe else model.num_layers
    stages = [build_stage(ctx, 1, 1 if i < dense_layers else 0, False, False, options)
              for i in range(model.num_layers)]
    send = ctx.tokens * ctx.hidden * ctx.act_bytes / (layout.tp if scatter else 1)
    embedding = build_stage(ctx, 0, 0, True, False, options)
    head = build_stage(ctx, 0, 0, False, True, options)
    return stages, [send] * len(stages), embedding, head, [True] * len(stages)


@dataclass(frozen=True)
class _Units:
    """A scenario's pipeline units priced one by one, with the first and last stage's fixed work."""

    works: list[StageWork]
    sends: list[float]  # bytes a cut after each unit sends
    first: StageWork | None
    last: StageWork | None
    model: CostModel
    gathering: dict[int, StageWork]  # id of a unit -> its twin whose passes gather its parameters first
    is_layer: list[bool]
    # under recompute_num_layers, each unit keeping its activations (``works`` recompute); else empty
    kept: list[StageWork]

    def passes_s(self, work: StageWork) -> tuple[float, float, float, float]:
        """(forward, whole backward, input-gradient, weight-gradient) seconds of one unit per microbatch."""
        twin = self.gathering.get(id(work), work)
        price = self.model.price
        return (price(work.forward).duration_s, price(twin.backward).duration_s,
                price(twin.backward_input).duration_s,
                price(work.backward_weight, self.model.weight_pass_slowdown).duration_s)


def _priced_units(scenario: Scenario, layout: Layout) -> _Units:
    model = CostModel(scenario, layout)
    stages, sends, first, last, is_layer = _unit_stages(scenario, layout)
    partly = scenario.parallel.recompute_num_layers is not None
    kept = _unit_stages(scenario, layout, keeping=True)[0] if partly else []
    # FSDP resharding after the forward under a pipeline gathers each unit once per microbatch
    # (mpsim/schedules/unshard.py): priced as the backward that gathers, after a forward that does not
    gathering: dict[int, StageWork] = {}
    if layout.fsdp_unsharding:
        twins, _, first_twin, last_twin, _ = _unit_stages(scenario, layout, unsharding=True)
        kept_twins = _unit_stages(scenario, layout, unsharding=True, keeping=True)[0] if partly else []
        gathering = {id(work): twin for work, twin in zip([*stages, first, last, *kept],
                                                          [*twins, first_twin, last_twin, *kept_twins])
                     if work is not None}
    return _Units(stages, sends, first, last, model, gathering, is_layer, kept)


def partition_problem(scenario: Scenario, layout: Layout, units: _Units | None = None,
                      schedule: Schedule | None = None) -> PartitionProblem:
    """The layer-by-layer costs of a scenario's model as a partition problem (``schedule``: the
    one whose microbatches in flight it budgets; the layout's own where not given)."""
    units = units or _priced_units(scenario, layout)
    model, stages, first, last = units.model, units.works, units.first, units.last

    def seconds(work: StageWork) -> float:
        forward_s, backward_s, _, _ = units.passes_s(work)
        return forward_s + backward_s

    parts = layout.num_stages
    same_node = layout.pp > 1 and pipeline_neighbours_share_node(layout, 0, 1)
    extra_s, extra_bytes = [0.0] * parts, [0.0] * parts
    extra_activation, extra_weight_grad = [0.0] * parts, [0.0] * parts
    schedule = schedule or _schedule(scenario, layout)
    in_flight = in_flight_per_stage(scenario, layout, schedule)
    pending = pending_weight_grads_per_stage(layout, schedule)
    for stage_index, work in ((0, first), (parts - 1, last)):
        if work is not None:
            extra_s[stage_index] += seconds(work)
            extra_bytes[stage_index] += _state_bytes(scenario, layout, work)
            extra_activation[stage_index] += work.activation_bytes
            extra_weight_grad[stage_index] += work.weight_grad_buffer_bytes
    training = scenario.training
    # what a rank holds besides its stages' state and activations: reserved memory, the communication
    # buffers at its peak, the fragmentation allowance; the rest is shared by the rank's chunks
    transient = _transient_bytes(scenario, layout, [*stages, *(w for w in (first, last) if w is not None)])

    def budget_of(system) -> float:
        """A chunk's share of one device of ``system`` (a part of a mixed cluster: its own reserve)."""
        reserved = sum(size for _, size in reserved_parts(scenario, layout, system))
        return (system.accelerator.memory.capacity * (1 - training.memory_fragmentation) - reserved - transient) \
            / layout.vpp

    budget = budget_of(scenario.cluster.system)
    ranks = tuple(schedule.stage_to_rank) if schedule is not None else tuple(s % layout.pp for s in range(parts))
    slowdown, budgets = _device_differences(model, ranks, stages, budget_of)
    return PartitionProblem(
        unit_s=tuple(seconds(work) for work in stages), parts=parts,
        recomputed_layers=scenario.parallel.recompute_num_layers if units.kept else None,
        kept_unit_s=tuple(seconds(work) for work in units.kept),
        kept_unit_activation_bytes=tuple(work.activation_bytes for work in units.kept),
        unit_is_layer=tuple(units.is_layer),
        boundary_s=tuple(p2p_time(size, same_node, model.system) if layout.pp > 1 else 0.0 for size in units.sends),
        unit_state_bytes=tuple(_state_bytes(scenario, layout, work) for work in stages),
        unit_activation_bytes=tuple(work.activation_bytes for work in stages),
        unit_weight_grad_bytes=tuple(work.weight_grad_buffer_bytes for work in stages),
        pending_weight_grads=pending if any(pending) else (),
        extra_s=tuple(extra_s), extra_bytes=tuple(extra_bytes), in_flight=in_flight, capacity_bytes=budget,
        stage_slowdown=slowdown, stage_capacity_bytes=budgets,
        extra_activation_bytes=tuple(extra_activation), extra_weight_grad_bytes=tuple(extra_weight_grad))


def _device_differences(model: CostModel, ranks: tuple[int, ...], units: list[StageWork],
                        budget_of: Callable[[object], float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(slowdown, memory budget) of each stage on its own device (``ranks``: each stage's pipeline
    rank as the schedule places it, round robin where it cannot be built); ((), ()) when every
    stage has the base device.

    A stage's slowdown is how much longer its device takes for all the model's units than
    the base device does: one ratio per device, exact for identical layers and a close
    estimate for mixed ones (docs/heterogeneous.md).
    """
    models = [model.on_rank(rank) for rank in ranks]
    if all(here is model for here in models):
        return (), ()

    def total_s(here: CostModel) -> float:
        return sum(here.price(work.forward).duration_s + here.price(work.backward).duration_s for work in units)

    base_s = total_s(model)
    ratio: dict[int, float] = {}
    for here in models:
        if id(here) not in ratio:
            ratio[id(here)] = total_s(here) / base_s if base_s > 0 else 1.0
    return (tuple(ratio[id(here)] for here in models),
            tuple(budget_of(here.system) for here in models))


def _rank_passes(schedule: Schedule) -> tuple[RankPasses, ...]:
    """Each rank's compute passes in its order, as the partition's rank walk reads them."""
    return tuple(tuple((stage, kind) for stage, kind, _ in flat(actions) if kind in ("F", "B", "I", "W"))
                 for actions in schedule.actions)


def _tightened(budgeted: PartitionProblem, problem: PartitionProblem, counts: tuple[int, ...],
               ranks: tuple[RankPasses, ...]) -> PartitionProblem:
    """``budgeted`` with the budget of each stage whose rank overflows under ``counts`` (walking
    ``ranks``, the passes of the split's own searched schedule) at most its budget in ``problem``
    less what the walk exceeds the per-stage bounds by, shared among the rank's stages: the split
    is then refused, and a split near it budgeted for what such a schedule holds beyond the bounds.
    """
    bound = [stage_bytes(problem, stage, *sums) for stage, sums in enumerate(stage_sums(problem, counts))]
    capacity = [budgeted.capacity_of(stage) for stage in range(problem.parts)]
    for passes in ranks:
        stages = sorted({stage for stage, _ in passes})
        peak = rank_peak_bytes(problem, counts, passes)
        if passes and peak > sum(problem.capacity_of(stage) for stage in stages):  # where the split overflows
            excess = peak - sum(bound[stage] for stage in stages)
            for stage in stages:
                capacity[stage] = min(capacity[stage], problem.capacity_of(stage) - excess / len(stages))
    return replace(budgeted, stage_capacity_bytes=tuple(capacity))


def _run_schedules(scenario: Scenario, layout: Layout, units: _Units, problem: PartitionProblem,
                   base: Schedule | None) -> Callable[[tuple[int, ...]], Schedule | None]:
    """The schedule the run takes for a split: the layout's own, or for zb-1p and zb-2p the one
    searched with the split's priced stage and transfer times (``simulate.searched_schedule``'s
    rule, each stage's times the sum of its units' and its fixed work's)."""
    name = scenario.parallel.schedule
    if base is None or not is_searched(name):
        return lambda counts: base
    search = SEARCHED[canonical_name(name)]
    unit_passes = [units.passes_s(work) for work in units.works]
    kept_passes = [units.passes_s(work) for work in units.kept] or unit_passes
    ends = problem.recompute_ends()
    extras = [[0.0] * 4 for _ in range(problem.parts)]
    for stage, work in ((0, units.first), (problem.parts - 1, units.last)):
        if work is not None:
            extras[stage] = [a + b for a, b in zip(extras[stage], units.passes_s(work))]

    def searched(counts: tuple[int, ...]) -> Schedule:
        cuts = counts_to_cuts(counts)
        slowdown = problem.stage_slowdown or (1.0,) * problem.parts

        def per_stage(kind: int) -> tuple[float, ...]:
            # a stage's first recompute_num_layers units recompute, the rest keep their activations
            return tuple((sum(p[kind] for p in unit_passes[a:min(ends[a], b)])
                          + sum(p[kind] for p in kept_passes[min(ends[a], b):b]) + extras[stage][kind])
                         * slowdown[stage] for stage, (a, b) in enumerate(cuts))

        sums = stage_sums(problem, counts, fixed=True)
        transfer_s = max((problem.boundary_s[b - 1] for a, b in cuts[:-1]), default=0.0)
        # (forward, whole backward, input gradient, weight gradient): the search takes the split backward
        times = StageTimes(per_stage(0), per_stage(2), per_stage(3), transfer_s,
                           tuple(kept for _, kept, _ in sums), tuple(waiting for _, _, waiting in sums))
        return search(times, layout.num_microbatches, rank_spans)

    return searched


# Rounds of tightening the budgets by what the searched schedule of the split found last holds
# beyond them (each round refuses that split; past the last, no split is taken as fitting)
MAX_SPLIT_ROUNDS = 8


def balanced_layers(scenario: Scenario, layout: Layout) -> tuple[tuple[int, ...], bool]:
    """(units per model chunk minimizing the slowest stage within the memory budget, whether one
    was found within it: where none is, the fastest split).

    A split is taken when every rank fits its device walking the passes of the schedule the
    run takes (:func:`mpsim.balance.partition.fits_ranks`). Where the run searches its
    schedule again with the priced times (zb-1p, zb-2p) and that schedule holds more than the
    budget counted, the budgets are tightened by the excess and the model split again. The split
    found without a budget is taken where it is faster and fits by that walk, which lets a
    rank's chunks share its memory unevenly.
    """
    units = _priced_units(scenario, layout)
    base = _schedule(scenario, layout)
    problem = partition_problem(scenario, layout, units, base)
    run_schedule = _run_schedules(scenario, layout, units, problem, base)

    def fits_as_run(counts: tuple[int, ...], schedule: Schedule | None) -> bool:
        return schedule is None or fits_ranks(problem, counts, _rank_passes(schedule))

    chosen, budgeted = None, problem
    for _ in range(MAX_SPLIT_ROUNDS):
        counts = balance(budgeted)
        if counts is None:
            break
        schedule = run_schedule(counts)
        if fits_as_run(counts, schedule):
            chosen = counts
            break
        budgeted = _tightened(budgeted, problem, counts, _rank_passes(schedule))
    fastest = balance(problem, use_memory=False)
    assert fastest is not None
    if fastest != chosen and (chosen is None or bottleneck_s(problem, fastest) < bottleneck_s(problem, chosen)) \
            and fits_as_run(fastest, run_schedule(fastest)):
        return fastest, True
    return (chosen, True) if chosen is not None else (fastest, False)
