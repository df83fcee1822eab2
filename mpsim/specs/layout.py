"""The layout a scenario resolves to: every derived size of its parallel plan.

Before any size is derived, the combinations a framework refuses at start-up are checked
(``layout_checks.py``: TP must divide the heads, fp8 needs Transformer Engine, ...); then
this module resolves data parallelism, the expert and ZeRO groups, the microbatch count
and the rank order, refusing what does not fit the cluster (the global batch must split
into microbatches over DP, tp x cp x pp must divide the devices), and the layers per
pipeline chunk (``pipeline_split.py``). Each violation is an :class:`InputError` naming the
field to change and how. ``parallel.layers_per_stage: auto`` needs prices, so it is
balanced after this step, on the main path (``mpsim/resolve.py``).

A schedule whose stages form several pipelines over the same layers (the bidirectional
DualPipe: two chains, ``mpsim/schedules/chains.py``) splits the layers into one block
per stage of a chain; ``layers_per_stage`` then has that many entries (``pp`` for
DualPipe) and every chain's ``k``-th stage holds block ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.schedules.chains import StageChains
from mpsim.schedules.registry import stage_chains
from mpsim.schedules.unshard import TORCH_GATHERED_CHUNKS, Gathering
from mpsim.specs.layout_checks import (check_context_parallel, check_deferred_head_wgrad, check_dtype,
                                       check_combined_1f1b, check_cuda_graphs, check_microbatch_groups,
                                       check_moe_dispatch, check_recompute_modules,
                                       check_tensor_parallel,
                                       check_op_recompute, check_userbuffers_sms, fail)
from mpsim.specs.pipeline_split import layers_per_chunk
from mpsim.specs.scenario import Scenario

ORDER_DIMS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Layout:
    """The resolved parallel layout: every derived number filled in."""

    tp: int
    pp: int
    dp: int
    vpp: int
    cp: int
    cp_comm: str
    ep: int
    etp: int
    zero_stage: int
    zero_shard_size: int  # DP ranks a ZeRO shard spans (dp unless hybrid sharding)
    microbatch_size: int
    global_batch_size: int
    num_microbatches: int
    layers_per_chunk: tuple[int, ...]  # in global stage order, pp*vpp entries (a block's count on each copy)
    devices: int
    devices_per_node: int
    order: tuple[str, ...]  # innermost first
    sequence_parallel: bool
    layer_split: str = "even"  # how layers_per_chunk was chosen: even, given or auto
    split_within_budget: bool | None = None  # auto: whether a split within the memory budget was found
    chains: tuple[int, ...] = ()  # stage chains of the schedule (mpsim/schedules/chains.py); (): one
    reshard_after_forward: bool = True  # ZeRO-3 / FSDP: gather the parameters again for the backward
    reshard_last_layer: bool = True  # with reshard_after_forward: the model's last layer too
    fsdp_gathered_chunks: int | None = TORCH_GATHERED_CHUNKS  # FSDP under a pipeline: chunks kept gathered; None: all
    microbatch_group_size: int | None = None  # interleaved-1f1b's microbatches per chunk in a row; None: default
    combined_1f1b: bool = False  # Megatron-Core's combined 1F1B (training.overlap_moe_expert_parallel_comm)

    @property
    def shard_ranks(self) -> int:
        """Ranks one ZeRO shard of the dense parameters spans: ``zero_shard_size`` DP ranks x CP.

        Dense parameters are replicated over data and context parallelism, and Megatron-Core's
        distributed optimizer shards each gradient bucket over that whole group
        (``intra_dp_cp_group``, ``get_data_parallel_group(with_context_parallel=True)``:
        megatron/core/distributed/distributed_data_parallel.py and
        megatron/core/optimizer/distrib_optimizer.py); torchtitan's FSDP shards over its
        ``dp_shard_cp`` mesh the same way. The optimizer state, its step and the
        reduce-scatter / all-gather all use this one shard.
        """
        return self.zero_shard_size * self.cp

    @property
    def fsdp_pipelined(self) -> bool:
        """FSDP (ZeRO-3) driven by a pipeline schedule: gradients reduced once per step.

        torch.distributed.pipelining runs every backward but a chunk's last with FSDP's
        gradient sync and its resharding after the backward turned off
        (``backward_maybe_with_nosync`` in torch/distributed/pipelining/stage.py:
        ``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``), and
        reduces them after the last (``perform_reduce_grad``). So each chunk's gradients
        accumulate unsharded (in the reduce dtype) and are reduce-scattered once, layer by
        layer after its last backward: the step's gradient collectives and gradient memory
        are ZeRO-1's (``state_zero_stage``). Where its parameters are gathered depends on
        ``reshard_after_forward``: ``fsdp_whole_step``, or ``mpsim/schedules/unshard.py``.
        """
        return self.zero_stage >= 3 and self.pp > 1

    @property
    def fsdp_whole_step(self) -> bool:
        """FSDP under a pipeline schedule without resharding after the forward (``fsdp_pipelined``).

        No forward reshards, and no backward but the last, so each chunk's parameters are
        gathered once, before its first forward, and stay gathered for the step, as
        torchtitan runs its pipelines by default and as Llama 3 ran: the weights' memory is
        ZeRO-1's too (``weights_sharded``). Not where the runtime's chunk window binds
        (``fsdp_windowed``): it frees chunks and gathers them again.
        """
        return self.fsdp_pipelined and not self.reshard_after_forward and not self.fsdp_windowed

    @property
    def fsdp_windowed(self) -> bool:
        """FSDP under a pipeline whose runtime keeps fewer of a rank's chunks gathered than it
        holds (``fsdp_gathered_chunks`` below ``vpp``): chunks leave the window, are freed and
        are gathered again (``mpsim/schedules/unshard.py``), whatever ``reshard_after_forward``."""
        return (self.fsdp_pipelined and self.fsdp_gathered_chunks is not None
                and self.vpp > self.fsdp_gathered_chunks)

    @property
    def fsdp_gathering(self) -> Gathering | None:
        """How parameters are gathered and freed within the step (FSDP under a pipeline that
        reshards after the forward or keeps a chunk window), or None where they are not."""
        if not (self.fsdp_unsharding or self.fsdp_windowed):
            return None
        return Gathering(self.reshard_after_forward, self.fsdp_gathered_chunks if self.fsdp_windowed else None)

    @property
    def fsdp_unsharding(self) -> bool:
        """FSDP under a pipeline schedule that reshards after the forward (FSDP2's default).

        A forward frees what it gathered; a backward gathers and keeps it, so a forward that
        follows a backward of its chunk gathers nothing, and a backward gathers only after a
        forward (``mpsim/schedules/unshard.py`` marks the passes that gather).
        """
        return self.fsdp_pipelined and self.reshard_after_forward

    @property
    def state_zero_stage(self) -> int:
        """The ZeRO stage the step's gradient collectives, gradients and optimizer state follow:
        1 for ``fsdp_pipelined``."""
        return 1 if self.fsdp_pipelined else self.zero_stage

    @property
    def weights_sharded(self) -> bool:
        """Whether each rank keeps only its shard of the weights between the passes that gather
        them (ZeRO-3, but not ``fsdp_whole_step``, which keeps them gathered for the step)."""
        return self.zero_stage >= 3 and not self.fsdp_whole_step

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert: the ranks of a pipeline stage that share its experts' shards."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (model chunks) over all ranks."""
        return self.pp * self.vpp

    @property
    def stage_chains(self) -> StageChains:
        """Which stages form each pipeline: chain starts hold the embedding, chain ends the head."""
        return StageChains(self.num_stages, self.chains)

    def stride(self, dim: str) -> int:
        """Distance in global rank between neighbours along ``dim``."""
        stride = 1
        for name in self.order:
            if name == dim:
                return stride
            stride *= getattr(self, name)
        raise KeyError(dim)


def resolve_layout(scenario: Scenario, chains: tuple[int, ...] | None = None) -> Layout:
    """Check the plan against the model and cluster; return the resolved layout.

    ``chains``: the stage chains of the schedule when known from elsewhere (a schedule
    file's directive); by default the registry says what the named schedule needs.

    ``layers_per_stage: auto`` resolves to a provisional even split marked
    ``layer_split="auto"``: balancing it needs the cost model, which is a step of the
    main path after this one (``mpsim/resolve.py``).
    """
    plan, system = scenario.parallel, scenario.cluster.system
    check_tensor_parallel(scenario)
    check_context_parallel(scenario)
    check_deferred_head_wgrad(scenario)
    check_userbuffers_sms(scenario)
    check_op_recompute(scenario)
    check_moe_dispatch(scenario)
    check_cuda_graphs(scenario)
    check_recompute_modules(scenario)
    dp = _data_parallel_size(scenario)
    ep, etp = _expert_parallel_sizes(scenario, dp)
    zero, shard = _zero_sharding(scenario, dp, ep, etp)
    num_microbatches = _num_microbatches(scenario, dp)
    chains = stage_chains(plan.schedule, plan.pp, plan.vpp) if chains is None else chains
    layers, split = layers_per_chunk(scenario, chains)
    order = _rank_order(scenario)
    check_dtype(scenario)
    check_microbatch_groups(scenario, num_microbatches)
    check_combined_1f1b(scenario, ep)
    if plan.recompute_num_layers is not None and plan.recompute != "full":
        raise fail("parallel.recompute_num_layers", f"recomputes whole layers, which needs parallel.recompute: "
                                                    f"full (got {plan.recompute})")
    return Layout(
        tp=plan.tp, pp=plan.pp, dp=dp, vpp=plan.vpp, cp=plan.cp, cp_comm=plan.cp_comm, ep=ep, etp=etp,
        zero_stage=zero,
        zero_shard_size=shard,
        microbatch_size=plan.microbatch_size,
        global_batch_size=plan.global_batch_size,
        num_microbatches=num_microbatches,
        layers_per_chunk=layers,
        devices=scenario.cluster.devices,
        devices_per_node=system.devices_per_node,
        order=order,
        sequence_parallel=plan.sequence_parallel and plan.tp > 1,
        layer_split=split,
        chains=chains,
        reshard_after_forward=plan.reshard_after_forward,
        reshard_last_layer=plan.reshard_last_layer,
        fsdp_gathered_chunks=plan.fsdp_gathered_chunks,
        microbatch_group_size=plan.microbatch_group_size,
        combined_1f1b=scenario.training.overlap_moe_expert_parallel_comm,
    )


def _data_parallel_size(scenario: Scenario) -> int:
    """DP: the devices left over by tp x cp x pp, or the given value when it matches."""
    plan, devices = scenario.parallel, scenario.cluster.devices
    tp, cp, pp = plan.tp, plan.cp, plan.pp
    if devices % (tp * cp * pp):
        raise fail("parallel", f"tp x cp x pp = {tp} x {cp} x {pp} = {tp * cp * pp} does not divide the cluster's "
                               f"{devices} devices")
    dp = plan.dp if plan.dp is not None else devices // (tp * cp * pp)
    if tp * cp * pp * dp != devices:
        raise fail("parallel.dp", f"tp x cp x pp x dp = {tp * cp * pp * dp}, but the cluster has {devices} "
                                  f"devices; set dp={devices // (tp * cp * pp)} or omit it")
    return dp


def _expert_parallel_sizes(scenario: Scenario, dp: int) -> tuple[int, int]:
    """(ep, etp): each expert split over etp ranks (tp by default), the experts spread over ep groups of
    those, all within the tp x cp x dp ranks of a pipeline stage.

    That is Megatron-Core's rule for its expert layout (MoE "parallel folding": the expert
    groups are laid over the same ranks as tensor, context and data parallelism, expert
    tensor parallelism innermost; ``initialize_model_parallel`` in
    megatron/core/parallel_state.py), so with ``etp`` below ``tp`` an expert-parallel group
    may take in tensor-parallel ranks: TP 2, DP 16 and ETP 1 allow EP 32.
    """
    plan, model = scenario.parallel, scenario.model
    ep = plan.ep
    etp = plan.etp if plan.etp is not None else plan.tp
    if (ep > 1 or plan.etp is not None) and model.moe is None:
        raise fail("parallel.ep", "expert parallelism needs a mixture-of-experts model (model.moe)")
    if model.moe is not None:
        if model.moe.num_experts % ep:
            raise fail("parallel.ep", f"ep={ep} does not divide the model's {model.moe.num_experts} experts")
        if plan.tp % etp or model.moe.expert_ffn_hidden_size % etp:
            raise fail("parallel.etp", f"etp={etp} must divide tp={plan.tp} and moe.expert_ffn_hidden_size="
                                       f"{model.moe.expert_ffn_hidden_size}")
        stage_ranks = plan.tp * plan.cp * dp
        if stage_ranks % (ep * etp):
            raise fail("parallel.ep", f"ep x etp = {ep} x {etp} must divide tp x cp x dp = {stage_ranks} (the expert "
                                      f"groups are laid over the ranks of a pipeline stage"
                                      f"{'; lower parallel.etp to fold tensor-parallel ranks into ep' if etp > 1 else ''})")
    return ep, etp


def _zero_sharding(scenario: Scenario, dp: int, ep: int, etp: int) -> tuple[int, int]:
    """(ZeRO stage, DP ranks a shard spans); Megatron's distributed optimizer is ZeRO-1.

    A shard of one rank (dp x cp = 1, and every expert on one rank) shards nothing: the
    rank holds and updates everything and gathers nothing, as without ZeRO, so the stage
    is 0 (``zero_sharding_note`` says so where a command prints).
    """
    plan = scenario.parallel
    zero = max(plan.zero_stage, 1 if scenario.training.distributed_optimizer else 0)
    shard = plan.zero_shard_size or dp
    if dp % shard:
        raise fail("parallel.zero_shard_size", f"{shard} does not divide dp={dp}")
    expert_replicas = plan.tp * plan.cp * dp // (ep * etp) if getattr(scenario.model, "moe", None) is not None else 1
    if shard * plan.cp == 1 and expert_replicas == 1:
        zero = 0
    return zero, shard


def zero_sharding_note(scenario: Scenario, layout: Layout) -> str | None:
    """One line for stderr when the scenario asks for ZeRO that has nothing to shard, or None."""
    asked = scenario.parallel.zero_stage
    if asked and layout.zero_stage == 0:
        return (f"note: ZeRO-{asked} shards over the data- and context-parallel ranks, and here there is one "
                f"(dp x cp = {layout.dp * layout.cp}): nothing is sharded, so the step is priced as without ZeRO")
    return None


def _num_microbatches(scenario: Scenario, dp: int) -> int:
    """Microbatches per pipeline per step: the global batch over dp x microbatch size."""
    plan = scenario.parallel
    per_step = dp * plan.microbatch_size
    if plan.global_batch_size % per_step:
        # a dp the scenario does not give comes from the cluster's size: say so, since a changed
        # system or node count shows up here first
        cluster = scenario.cluster
        nodes = cluster.nodes
        count = f"{cluster.devices}" if cluster.num_devices is not None or nodes is None else (
            f"{nodes} node{'s' if nodes > 1 else ''} x {cluster.system.devices_per_node} = {cluster.devices}")
        derived = "" if plan.dp is not None else (
            f" (dp={dp} is the cluster's {count} devices over tp x cp x pp = {plan.tp * plan.cp * plan.pp})")
        raise fail("parallel.global_batch_size",
                   f"global_batch_size={plan.global_batch_size} is not divisible by dp x microbatch_size = "
                   f"{dp} x {plan.microbatch_size} = {per_step}{derived}")
    return plan.global_batch_size // per_step


def _rank_order(scenario: Scenario) -> tuple[str, ...]:
    """The parallel dimensions from innermost to outermost rank, cp added beside tp when left out at size 1."""
    plan = scenario.parallel
    order = tuple(plan.order.split("-"))
    if "cp" not in order and plan.cp == 1 and "tp" in order:
        order = (*order[:order.index("tp") + 1], "cp", *order[order.index("tp") + 1:])  # a size-1 dimension
    if sorted(order) != sorted(ORDER_DIMS):
        raise fail("parallel.order", f"{plan.order!r} must name each of {', '.join(ORDER_DIMS)} once, "
                                     f"innermost first, e.g. 'tp-cp-dp-pp'")
    return order
