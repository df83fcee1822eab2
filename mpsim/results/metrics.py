"""Metrics of one simulated step: time, throughput, MFU/HFU, bubble and its causes, memory.

Conventions, stated because they swing the numbers:

* ``bubble_fraction``: mean over pipeline ranks of the time the rank's compute stream is
  idle before the last pipeline action anywhere ends, divided by that pipeline time.
  With uniform stages and free communication it is exactly (p-1)/(m+p-1) for 1F1B.
* Idle time is split interval by interval (see ``idle.py``) into the schedule's own fill
  and drain, stage imbalance, pipeline transfers and blocking sends; the split between
  the first two needs a :class:`~mpsim.simulate.BubbleReference` (the same schedule run
  with balanced stages and free communication). ``bubble_schedule_s``,
  ``bubble_imbalance_s`` and ``bubble_comm_s`` are means over ranks and add up to
  ``bubble_s`` (with ``stage-wait`` idle when no reference was given).
* ``bubble_rate_zb`` is Zero Bubble's definition (Qi et al. 2024, Sec. 5.3): the longest
  stage span (first action start to last action end) minus the busiest stage's compute,
  over that span.
* ``mfu`` uses model FLOPs (no recompute, full attention matrix; Korthikanti et al. 2022
  eq. 7, NeMo's formula for GQA/SwiGLU); ``hfu`` uses the FLOPs the simulated ranks
  executed, recompute and causal-attention savings included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpsim.results.idle import idle_by_kind, idle_intervals
from mpsim.results.memory import RankMemory, rank_memory
from mpsim.results.throughput import throughput_unit
from mpsim.simulate import BubbleReference, SimulationResult
from mpsim.workload.flops import model_flops_per_sequence


@dataclass(frozen=True)
class RankTime:
    """Where one pipeline rank's step went, in seconds."""

    rank: int
    compute_s: float  # actions on the compute stream, in-line TP communication included
    tp_comm_exposed_s: float  # tensor-parallel collectives not hidden under compute
    cp_comm_exposed_s: float  # context-parallel KV exchange not hidden under attention
    ep_comm_exposed_s: float  # MoE token all-to-alls (and expert-TP gathers) not hidden
    zero_gather_exposed_s: float  # ZeRO-3 / FSDP parameter gathers waited for
    idle_schedule_s: float  # fill and drain of the schedule itself (warm-up, cool-down)
    idle_imbalance_s: float  # waiting for a slower stage
    idle_stage_wait_s: float  # waiting for another stage when no reference run split it
    idle_transfer_s: float  # waiting for a pipeline transfer in flight
    idle_send_s: float  # waiting for the rank's own blocking sends
    dp_comm_exposed_s: float  # after the last backward, until gradients are reduced
    embedding_sync_s: float
    optimizer_s: float
    end_s: float
    span_s: float  # first action start to last action end
    host_wait_s: float = 0.0  # inside the actions: the GPU waiting for the host to launch kernels
    amax_exposed_s: float = 0.0  # inside the actions: fp8 amax all-reduces (Transformer Engine), all exposed

    @property
    def idle_s(self) -> float:
        return (self.idle_schedule_s + self.idle_imbalance_s + self.idle_stage_wait_s + self.idle_transfer_s
                + self.idle_send_s)


@dataclass(frozen=True)
class Summary:
    """The report of one simulated step."""

    scenario: str
    system: str
    accelerator: str
    devices: int
    tp: int
    cp: int
    pp: int
    dp: int
    vpp: int
    ep: int
    zero_stage: int
    microbatch_size: int
    num_microbatches: int
    global_batch_size: int
    schedule: str
    step_time_s: float
    pipeline_time_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    model_tflops_per_device: float
    mfu: float
    hfu: float
    bubble_fraction: float
    bubble_s: float
    bubble_rate_zb: float
    bubble_schedule_s: float
    bubble_imbalance_s: float
    bubble_comm_s: float
    exposed_tp_comm_s: float
    exposed_cp_comm_s: float
    exposed_ep_comm_s: float
    exposed_pp_comm_s: float
    exposed_dp_comm_s: float
    optimizer_s: float
    peak_memory_bytes: float
    capacity_bytes: float
    out_of_memory: bool
    ranks: list[RankTime] = field(default_factory=list)
    memory: list[RankMemory] = field(default_factory=list)
    layers_per_stage: tuple[int, ...] = ()  # layers (or layer-stack units) of each model chunk, in stage order
    layer_split: str = "even"  # how they were chosen: even, given (parallel.layers_per_stage) or auto
    split_within_budget: bool | None = None  # auto: whether it found a split within the memory budget
    throughput_unit: str = "tokens"  # what throughput_per_s counts: tokens, images, samples or audio seconds
    throughput_per_s: float = 0.0  # the step's rate in that unit (results/throughput.py)
    host_wait_s: float = 0.0  # mean over pipeline ranks of their actions' waits for kernel launches
    calibration: str | None = None  # the calibration profile that priced the step, in words; None: the datasheets
    microbatch_group_size: int | None = None  # interleaved-1f1b's microbatches per chunk in a row; None: default
    combined_1f1b: bool = False  # Megatron-Core's combined 1F1B (training.overlap_moe_expert_parallel_comm)
    recompute: str = "none"  # parallel.recompute
    recompute_modules: tuple[str, ...] = ()  # what selective recompute runs again (parallel.recompute_modules)
    cuda_graph_modules: tuple[str, ...] = ()  # the parts of each layer captured in CUDA graphs
    # training.optimizer_post_validation: how much shorter the period of a long run is than the step
    # alone (its fill and drain run under the neighbouring steps); 0 when steps do not overlap
    cross_step_overlap_s: float = 0.0


def _rank_time(result: SimulationResult, rank: int, pipeline_end: float,
               reference: BubbleReference | None) -> RankTime:
    timeline = result.timeline
    records = timeline.actions[rank]
    compute = sum(r.end_s - r.start_s for r in records)
    # each cost's parts once (a rank runs each cost many times), then summed record by record
    parts_of: dict[int, tuple[float, ...]] = {}
    parts = []
    for record in records:
        cost = result.cost(record.action)
        found = parts_of.get(id(cost))
        if found is None:
            found = parts_of[id(cost)] = (cost.exposed("tp"), cost.exposed("cp"), cost.exposed("ep", "etp"),
                                          cost.dp_exposed_s, cost.host_wait_s, cost.exposed("amax"))
        parts.append(found)
    tp_exposed, cp_exposed, ep_exposed, zero_wait, host_wait, amax = (sum(p[i] for p in parts) for i in range(6))
    waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
    idle = idle_by_kind(idle_intervals(timeline, rank, pipeline_end, waits))
    compute_end = records[-1].end_s if records else 0.0
    syncs = timeline.syncs_of(rank)
    dp_end = max((s.end_s for s in syncs if s.kind == "dp-comm"), default=compute_end)
    embedding = sum(s.end_s - s.start_s for s in syncs if s.kind == "embedding-sync")
    optimizer = sum(s.end_s - s.start_s for s in syncs if s.kind == "optimizer")
    span = (records[-1].end_s - records[0].start_s) if records else 0.0
    # a chunk gathered again by FSDP's window and waited for between the actions (results/idle.py)
    zero_wait += idle["gather"]
    return RankTime(rank, compute, tp_exposed, cp_exposed, ep_exposed, zero_wait, idle["schedule"], idle["imbalance"], idle["stage-wait"],
                    idle["transfer"], idle["send"], max(0.0, dp_end - compute_end), embedding, optimizer,
                    timeline.rank_end_s[rank], span, host_wait, amax)


def summarize(result: SimulationResult, reference: BubbleReference | None = None) -> Summary:
    """All metrics of a simulated step; ``reference`` adds the bubble's attribution."""
    scenario, layout, timeline = result.scenario, result.layout, result.timeline
    system = scenario.cluster.system
    accelerator = system.accelerator
    step = timeline.step_time_s
    pipeline_end = timeline.pipeline_end_s
    ranks = [_rank_time(result, r, pipeline_end, reference) for r in range(timeline.num_ranks)]
    n = len(ranks)
    tokens = layout.global_batch_size * scenario.model.seq_length
    unit = throughput_unit(scenario.model)
    model_flops = model_flops_per_sequence(scenario.model) * layout.global_batch_size
    # each simulated rank stands for its TP and CP groups and every DP replica
    executed = sum(result.cost(r.action).flops for rs in timeline.actions for r in rs)
    hardware_flops = executed * layout.tp * layout.cp * layout.dp
    peak_flops = accelerator.peak(scenario.training.dtype)
    capacity = accelerator.memory.capacity
    memory = rank_memory(scenario, layout, result.schedule, result.workload)
    peak_memory = max(m.peak_memory_bytes for m in memory)
    out_of_memory = peak_memory > capacity
    parts = scenario.cluster.parts or []
    mixed = any(part.system != system for part in parts)  # parts of one system report as that system
    system_name, accelerator_name = system.name, accelerator.name
    if mixed:  # each part its own peak and memory: the mean peak FLOP/s, the fullest rank's memory
        peak_flops = sum(part.nodes * part.system.devices_per_node * part.system.accelerator.peak(
            scenario.training.dtype) for part in parts) / layout.devices
        out_of_memory = any(not m.fits for m in memory)
        fullest = max(memory, key=lambda m: m.peak_memory_bytes / m.capacity_bytes)
        peak_memory, capacity = fullest.peak_memory_bytes, fullest.capacity_bytes
        # "2 dgx-a100 + 2 dgx-h100 nodes", "a100-sxm-80gb/h100-sxm-80gb"
        system_name = " + ".join(f"{part.nodes} {part.system.name}" for part in parts) + " nodes"
        accelerator_name = "/".join(dict.fromkeys(part.system.accelerator.name for part in parts))
    mean = lambda values: sum(values) / n  # noqa: E731
    idle = [r.idle_s for r in ranks]
    # Zero Bubble's definition: cost is the longest stage span, ideal the busiest stage's compute
    longest = max(r.span_s for r in ranks)
    zb_rate = (longest - max(r.compute_s for r in ranks)) / longest if longest > 0 else 0.0
    return Summary(
        scenario=scenario.name,
        system=system_name,
        accelerator=accelerator_name,
        devices=layout.devices,
        tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=layout.dp, vpp=layout.vpp, ep=layout.ep,
        zero_stage=layout.zero_stage,
        microbatch_size=layout.microbatch_size,
        num_microbatches=layout.num_microbatches,
        global_batch_size=layout.global_batch_size,
        schedule=result.schedule.name,
        step_time_s=step,
        pipeline_time_s=pipeline_end,
        tokens_per_s=tokens / step,
        tokens_per_s_per_device=tokens / step / layout.devices,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hardware_flops,
        model_tflops_per_device=model_flops / step / layout.devices / 1e12,
        mfu=model_flops / (step * layout.devices * peak_flops),
        hfu=hardware_flops / (step * layout.devices * peak_flops),
        bubble_fraction=mean(idle) / pipeline_end if pipeline_end > 0 else 0.0,
        bubble_s=mean(idle),
        bubble_rate_zb=zb_rate,
        bubble_schedule_s=mean([r.idle_schedule_s for r in ranks]),
        bubble_imbalance_s=mean([r.idle_imbalance_s for r in ranks]),
        bubble_comm_s=mean([r.idle_transfer_s + r.idle_send_s for r in ranks]),
        exposed_tp_comm_s=mean([r.tp_comm_exposed_s for r in ranks]),
        exposed_cp_comm_s=mean([r.cp_comm_exposed_s for r in ranks]),
        exposed_ep_comm_s=mean([r.ep_comm_exposed_s for r in ranks]),
        exposed_pp_comm_s=mean([r.idle_transfer_s + r.idle_send_s for r in ranks]),
        exposed_dp_comm_s=mean([r.dp_comm_exposed_s + r.embedding_sync_s + r.zero_gather_exposed_s + r.amax_exposed_s
                                for r in ranks]),
        optimizer_s=max(r.optimizer_s for r in ranks),
        peak_memory_bytes=peak_memory,
        capacity_bytes=capacity,
        out_of_memory=out_of_memory,
        ranks=ranks,
        memory=memory,
        layers_per_stage=tuple(layout.layers_per_chunk),
        layer_split=layout.layer_split,
        split_within_budget=layout.split_within_budget,
        throughput_unit=unit.name,
        throughput_per_s=layout.global_batch_size * unit.per_sample / step,
        host_wait_s=mean([r.host_wait_s for r in ranks]),
        calibration=calibration_text(scenario.calibration),
        microbatch_group_size=layout.microbatch_group_size,
        combined_1f1b=layout.combined_1f1b,
        recompute=scenario.parallel.recompute,
        recompute_modules=scenario.parallel.selective_modules,
        cuda_graph_modules=tuple(scenario.training.cuda_graph_modules),
        cross_step_overlap_s=timeline.span_s - step,
    )


def profiled_collectives(profile) -> list[str]:
    """The collective kinds a calibration profile prices from its own fitted lines (none without one)."""
    return sorted({fit.kind for fit in profile.links.collectives}) if profile and profile.links else []


def calibration_text(profile) -> str | None:
    """What prices the step instead of the datasheets, in words, or None."""
    if profile is None:
        return None
    how = "fitted from profiler traces" if profile.source == "trace" else "measured"
    kinds = profiled_collectives(profile)
    lines = f"; collectives ({', '.join(kinds)}) from its fitted lines" if kinds else ""
    return f"a profile {how} on {profile.device.name}{lines}"
