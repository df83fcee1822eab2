"""Peak memory per pipeline rank, by category, and activation memory over time.

Categories: weights, gradients and optimizer state (sharded per the ZeRO stage over
DP x CP ranks), activations as the schedule holds them, temporary communication buffers
(with FSDP's ``reshard_after_forward`` off: the gathered parameters of every stage with a
microbatch between its forward and its backward; under a pipeline with it on: those of
every stage whose last pass was a backward), the memory the process reserves
outside its tensors (CUDA context, cuBLAS workspace, NCCL buffers:
``workload.memory.reserved_parts``) and allocator fragmentation.

Activations are counted by walking the rank's action list: a forward adds the stage's
per-microbatch activations, a full backward frees them, an input-gradient backward frees
all but what its weight-gradient half still needs, which that ``W`` then frees. The peak
of that walk is the schedule's real in-flight memory (``p`` microbatches on the first
rank of 1F1B, all ``m`` for GPipe, more for interleaved schedules). A zero-bubble
schedule can peak with no forward in flight at all: what it holds then is the inputs
and output gradients its deferred ``W`` passes still need (``weight_grad_held_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.cost.devices import part_of_pp_ranks
from mpsim.schedules.actions import Schedule, flat, parts, stages_by_rank
from mpsim.schedules.unshard import Gathering, rank_gathers
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.memory import (gathered_params_bytes, held_params, model_state_bytes, model_state_options,
                                   reserved_parts, transient_buffers_bytes)
from mpsim.workload.stage_work import Workload


# How much more than its allocated peak a real process reserves depends on the run (the
# caching allocator's splits, recompute, PYTORCH_CUDA_ALLOC_CONF), so mpsim models none
# unless told (training.memory_fragmentation). Published training logs that print both
# peaks: NeMo 25.07, Qwen3-30B-A3B on 16 H100, 57,466,159,104 B reserved over 53,930,270,720
# allocated at iteration 8 (+6.6 %; NVIDIA-NeMo issue 14850); the sample output of a Megatron-LM
# pull request of 2026, 6406.00 over 5670.39 MB (+13.0 %; NVIDIA/Megatron-LM 5662); Megatron-LM
# with recompute, ZeRO and offload on 8 GPUs, +22 to +97 % per pipeline stage, +5 to +87 % with
# expandable segments (the STAlloc artifact, github.com/infinigence/STAlloc, example/analyze,
# commit a485ddc). The least of them is what a layout should at least leave free.
LEAST_MEASURED_FRAGMENTATION = 0.066


def tight_fit(peak_bytes: float, capacity_bytes: float, fragmentation: float) -> bool:
    """Whether a layout fits only because no fragmentation is modelled (``fragmentation``, a
    fraction or bytes, is 0): it leaves less free than the least a published run reserved
    beyond its allocated peak, taken of the whole peak."""
    return (fragmentation == 0 and peak_bytes <= capacity_bytes
            and capacity_bytes - peak_bytes < LEAST_MEASURED_FRAGMENTATION * peak_bytes)


TIGHT_FIT_ADVICE = (f"published training logs reserved {100 * LEAST_MEASURED_FRAGMENTATION:.1f} to 97 % more than "
                    f"they allocated (docs/parallelism.md); set training.memory_fragmentation to your run's "
                    f"max_memory_reserved / max_memory_allocated - 1")


@dataclass(frozen=True)
class RankMemory:
    """Memory of one pipeline rank at its peak (every TP/DP peer holds the same)."""

    rank: int
    stages: tuple[int, ...]
    params: float  # parameters the rank's stages have on one device, before ZeRO sharding
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_peak_bytes: float
    peak_in_flight: int  # (stage, microbatch) forwards held at the peak
    buffers_bytes: float  # temporary communication buffers (gathered inputs, ZeRO-3 layers, MoE all-to-all)
    reserved_bytes: float  # framework memory outside tensors (training.memory_reserved)
    fragmentation_bytes: float
    capacity_bytes: float
    layer_state_bytes: float = 0.0  # weights + gradients + optimizer of the transformer layers only
    layer_activations_peak_bytes: float = 0.0  # peak of the transformer layers' activations only
    reserved_parts: tuple[tuple[str, float], ...] = ()  # what reserved_bytes is made of: (name, bytes)
    gathered_params_bytes: float = 0.0  # of the buffers: ZeRO-3 parameters held from forward to backward
    weight_grad_held_bytes: float = 0.0  # of the activations peak: what deferred W passes hold (from I until W)

    @property
    def model_state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def peak_memory_bytes(self) -> float:
        return (self.model_state_bytes + self.activations_peak_bytes + self.buffers_bytes + self.reserved_bytes
                + self.fragmentation_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes

    @property
    def largest_category(self) -> str:
        """The category that takes the most memory (what to shrink first)."""
        parts = {"weights": self.weights_bytes, "gradients": self.grads_bytes,
                 "optimizer state": self.optimizer_bytes, "activations": self.activations_peak_bytes,
                 "communication buffers": self.buffers_bytes, "reserved": self.reserved_bytes}
        return max(parts, key=parts.__getitem__)


def _activation_deltas(work, kind: str) -> tuple[float, int]:
    """(change in held activation bytes, change in forwards in flight) when an action ends."""
    if kind == "F":
        return work.activation_bytes, 1
    if kind == "B":
        return -work.activation_bytes, -1
    if kind == "I":
        return work.weight_grad_buffer_bytes - work.activation_bytes, -1
    return -work.weight_grad_buffer_bytes, 0  # W


def memory_timeline(timeline, schedule: Schedule, workload: Workload, layout: Layout, rank: int
                    ) -> list[tuple[float, float]]:
    """(time, bytes) after every action of ``rank`` on the simulated timeline: the activations
    and weight-gradient buffers held, and the gathered parameters where ZeRO-3 holds them
    (``param_steps``); the step's other memory is a constant floor under it.

    What an action adds is counted from its start, what it frees from its end (an action
    that frees more than it adds: from its end), in the memory walk's order, so that the
    highest point is ``walk_peak``'s.
    """
    steps = param_steps(schedule, rank, workload, held_params(layout), layout.fsdp_gathering)
    level = sum(gathered_params_bytes(workload.stages[stage]) for stage in steps.resident)
    points = [(0.0, level)]
    index = 0
    for record in timeline.actions[rank]:
        for action in parts(record.action):
            ahead = steps.before_bytes(index)
            if ahead:
                level += ahead  # a chunk window's gathers and frees, as the action starts
                points.append((max(record.start_s, points[-1][0]), level))
            delta = _activation_deltas(workload.stages[action.stage], action.kind)[0] + steps.changes[index]
            level += delta
            # never before the point ahead of it: a pair's backward that gathers adds from its start,
            # after its forward that freed more than it added counted from its end
            points.append((max(record.start_s if delta > 0 else record.end_s, points[-1][0]), level))
            if steps.freed_after[index]:
                level -= steps.freed_after[index]
                points.append((record.end_s, level))
            index += 1
    return points


@dataclass(frozen=True)
class ParamSteps:
    """Gathered ZeRO-3 / FSDP parameters along one rank's action list (``param_steps``)."""

    resident: tuple[int, ...]  # stages whose parameters are gathered when the step starts
    changes: tuple[float, ...]  # per action: bytes it gathers (+) or frees (-)
    freed_after: tuple[float, ...]  # per action: bytes freed once it has ended (a chunk's last pass)
    # per action: (stage, bytes) the pipeline runtime frees (-) and then gathers (+) just before it
    # (FSDP's chunk window, ``schedules.unshard.window_changes``); empty where none
    before: tuple[tuple[tuple[int, float], ...], ...] = ()

    def before_bytes(self, index: int) -> float:
        """Net bytes the runtime gathers just before action ``index``."""
        return sum(size for _, size in self.before[index]) if self.before else 0.0


def param_steps(schedule: Schedule, rank: int, workload: Workload, hold_params: bool = False,
                gathering: Gathering | None = None, actions: list | None = None) -> ParamSteps:
    """Where the rank's gathered parameters come and go, action by action of ``flat(schedule.actions[rank])``.

    With ``hold_params`` (ZeRO-3 without ``reshard_after_forward``) a stage's parameters are
    gathered by the forward that opens its first microbatch and freed by the backward
    that closes its last. With ``gathering`` (FSDP under a pipeline, ``Layout.fsdp_gathering``)
    they follow ``schedules.unshard.rank_gathers``: every stage of the rank gathered when the
    step starts (with a chunk window, the first ones it computes), a forward resharding after
    itself frees them, a backward that finds them freed gathers and keeps them, the stage's
    last pass frees them once it ends, and a window frees and gathers whole chunks between
    passes. FSDP gathers and frees layer by layer as a pass goes; taken with the pass's
    activations as one change, that is the layer-by-layer peak to within a layer.
    """
    if actions is None:
        actions = flat(schedule.actions[rank])
    changes = [0.0] * len(actions)
    freed_after = [0.0] * len(actions)
    if not (hold_params or gathering):
        return ParamSteps((), tuple(changes), tuple(freed_after))
    size_of = lambda stage: gathered_params_bytes(workload.stages[stage])  # noqa: E731
    start: tuple[int, ...] = ()
    before: tuple[tuple[tuple[int, float], ...], ...] = ()
    if gathering is not None:
        held = stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)[rank]
        plan = rank_gathers(schedule.actions[rank], held, gathering)
        start = plan.start
        for index, (stage, _, _) in enumerate(actions):
            changes[index] = plan.change[index] * size_of(stage)
            freed_after[index] = sum(size_of(freed) for freed in plan.freed_after[index])
        if any(plan.before):
            before = tuple(tuple((stage, sign * size_of(stage)) for stage, sign in steps) for steps in plan.before)
    open_forwards: dict[int, int] = {}
    for index, (stage, kind, _) in enumerate(actions):
        count = _activation_deltas(workload.stages[stage], kind)[1]
        if hold_params and count:
            size = size_of(stage)
            opened = open_forwards.get(stage, 0)
            open_forwards[stage] = opened + count
            if opened == 0 and count > 0:
                changes[index] += size
            elif opened + count == 0:
                changes[index] -= size
    return ParamSteps(start, tuple(changes), tuple(freed_after), before)


@dataclass(frozen=True)
class WalkPeak:
    """The highest point of a rank's walk over its action list, and what is held there."""

    bytes: float  # activations (with the held parameters, when counted) at the peak
    in_flight: int  # (stage, microbatch) forwards between their forward and their backward
    gathered_params_bytes: float  # of the bytes, unsharded parameters held from forward to backward
    weight_grad_held_bytes: float  # of the bytes, what input-gradient passes left for their W


def walk_peak(schedule: Schedule, rank: int, workload: Workload, layers_only: bool = False,
              hold_params: bool = False, gathering: Gathering | None = None) -> WalkPeak:
    """The peak of the rank's action list, as ``WalkPeak``.

    The bytes are the activations the schedule holds and the gathered parameters
    ``param_steps`` says are held (``hold_params``: ZeRO-3 without ``reshard_after_forward``;
    ``gathering``: FSDP under a pipeline, ``Layout.fsdp_gathering``). What a chunk window
    gathers before an action counts before the action's own change.
    """
    actions = flat(schedule.actions[rank])
    tracked = hold_params or gathering is not None
    steps = param_steps(schedule, rank, workload, hold_params, gathering, actions) if tracked else None
    level = held = sum(gathered_params_bytes(workload.stages[stage]) for stage in steps.resident) if steps else 0.0
    for_weight_grads = 0.0
    in_flight = 0
    best = WalkPeak(level, 0, held, 0.0)
    for index, (stage, kind, _) in enumerate(actions):
        if steps is not None and steps.before:
            ahead = steps.before_bytes(index)
            held += ahead
            level += ahead
            if level > best.bytes:
                best = WalkPeak(level, in_flight, held, for_weight_grads)
        work = workload.stages[stage]
        delta, count = _activation_deltas(work, kind)
        if layers_only and kind != "W":
            # the layers' share only (weight-gradient buffers are the layers' anyway)
            delta = {"F": work.layer_activation_bytes, "B": -work.layer_activation_bytes,
                     "I": work.weight_grad_buffer_bytes - work.layer_activation_bytes}[kind]
        if kind in ("I", "W"):
            for_weight_grads += work.weight_grad_buffer_bytes if kind == "I" else -work.weight_grad_buffer_bytes
        if steps is not None:
            held += steps.changes[index]
            delta += steps.changes[index]
        level += delta
        in_flight += count
        if level > best.bytes:
            best = WalkPeak(level, in_flight, held, for_weight_grads)
        if steps is not None and steps.freed_after[index]:
            held -= steps.freed_after[index]
            level -= steps.freed_after[index]
    return best


def activation_walk(schedule: Schedule, rank: int, workload: Workload, layers_only: bool = False
                    ) -> tuple[float, int]:
    """(peak activation bytes, forwards in flight at the peak) over the rank's action list."""
    walk = walk_peak(schedule, rank, workload, layers_only)
    return walk.bytes, walk.in_flight


def _buffers_bytes(works: list, workload: Workload, layout: Layout) -> float:
    """Transient communication buffers at the rank's peak (``transient_buffers_bytes``)."""
    largest = max((w.largest_layer_params for w in works), default=0.0)
    return transient_buffers_bytes(largest, workload.context.activation_message, layout)


@dataclass(frozen=True)
class RankState:
    """What a pipeline rank holds whatever its schedule does: model state, buffers, capacity.

    ``rank_memory`` adds the schedule's walk to it; the planner keeps it per layout and
    stage placement and checks many schedules against it (``explore/memfast.py``).
    """

    stages: tuple[int, ...]
    params: float  # dense + expert parameters on one device, before ZeRO sharding
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    state_bytes: float  # dense state total + expert state total, in that order (what fragmentation scales)
    layer_state_bytes: float
    buffers_bytes: float  # transient buffers, without parameters a walk holds
    capacity_bytes: float


def rank_states(scenario: Scenario, layout: Layout, stage_to_rank: tuple[int, ...], num_ranks: int,
                workload: Workload) -> list[RankState]:
    """``RankState`` of each pipeline rank for a stage placement."""
    capacity = scenario.cluster.system.accelerator.memory.capacity
    # a heterogeneous cluster: each pipeline rank has its own part's memory
    part_of = part_of_pp_ranks(scenario, layout) if scenario.cluster.parts else ()
    kwargs = model_state_options(scenario, layout)
    held = stages_by_rank(stage_to_rank, num_ranks)
    # ranks holding the same stage works (one object per kind of stage) on the same memory hold
    # the same state: the middle ranks of a pipeline are computed once
    alike: dict[tuple, tuple] = {}
    states = []
    for rank in range(num_ranks):
        stages = tuple(held[rank])
        works = [workload.stages[s] for s in stages]
        if part_of and scenario.cluster.parts:
            capacity = scenario.cluster.parts[part_of[rank]].system.accelerator.memory.capacity
        key = (tuple(map(id, works)), capacity)
        found = alike.get(key)
        if found is None:
            dense = sum(w.params for w in works)
            experts = sum(w.expert_params for w in works)
            # dense parameters shard over DP x CP (Layout.shard_ranks), experts over their replicas
            state = model_state_bytes(dense, shard=layout.shard_ranks, **kwargs)
            expert_state = model_state_bytes(experts, shard=layout.expert_dp, **kwargs)
            layers = model_state_bytes(sum(w.layer_params for w in works), shard=layout.shard_ranks, **kwargs)
            found = alike[key] = (
                dense + experts, state.weights_bytes + expert_state.weights_bytes,
                state.grads_bytes + expert_state.grads_bytes, state.optimizer_bytes + expert_state.optimizer_bytes,
                state.total_bytes + expert_state.total_bytes, layers.total_bytes,
                _buffers_bytes(works, workload, layout), capacity)
        states.append(RankState(stages, *found))
    return states


def rank_at_peak(rank: int, state: RankState, walk: WalkPeak, reserved: tuple[tuple[str, float], ...],
                 fragmentation: float, layer_peak: float = 0.0) -> RankMemory:
    """A rank's memory from its state and its walk's peak (``reserved``: ``reserved_parts``)."""
    gathered = walk.gathered_params_bytes
    peak = walk.bytes - gathered  # the held parameters are reported with the buffers
    buffers = state.buffers_bytes + gathered
    allocated = state.state_bytes + peak + buffers
    return RankMemory(
        rank, state.stages, state.params, state.weights_bytes, state.grads_bytes, state.optimizer_bytes,
        peak, walk.in_flight, buffers, sum(size for _, size in reserved), allocated * fragmentation,
        state.capacity_bytes, state.layer_state_bytes, layer_peak, reserved, gathered, walk.weight_grad_held_bytes)


def rank_memory(scenario: Scenario, layout: Layout, schedule: Schedule, workload: Workload, *,
                peak_of=walk_peak, layer_peaks: bool = True) -> list[RankMemory]:
    """Memory of every pipeline rank, by category.

    ``peak_of`` is ``walk_peak`` or a function that returns the same; without
    ``layer_peaks`` the layers-only peak is left at 0 (only reports show it).
    """
    # a cluster of parts: each pipeline rank reserves what its own part's devices and NCCL do
    parts = scenario.cluster.parts
    if parts:
        of_part = [reserved_parts(scenario, layout, part.system) for part in parts]
        reserved_of_rank = [of_part[index] for index in part_of_pp_ranks(scenario, layout)]
    else:
        reserved_of_rank = [reserved_parts(scenario, layout)] * schedule.num_ranks
    fragmentation = scenario.training.memory_fragmentation
    hold = held_params(layout)
    result = []
    for rank, state in enumerate(rank_states(scenario, layout, schedule.stage_to_rank, schedule.num_ranks,
                                             workload)):
        walk = peak_of(schedule, rank, workload, hold_params=hold, gathering=layout.fsdp_gathering)
        layer_peak = activation_walk(schedule, rank, workload, layers_only=True)[0] if layer_peaks else 0.0
        result.append(rank_at_peak(rank, state, walk, reserved_of_rank[rank], fragmentation, layer_peak))
    return result
