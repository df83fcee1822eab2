"""Cross-field rules a real framework enforces, and the layout they resolve to.

Pydantic checks each field on its own; this module checks the combinations that
Megatron-LM refuses at start-up (TP must divide the heads, the global batch must split
into microbatches over DP, ...). Each violation is an :class:`InputError` naming the
field to change and how. A layer stack gets its own rules instead of the transformer's
head and FFN rules: every layer must have a tensor-parallel split at the chosen ``tp``
(``stack_tp.py``). ``parallel.layers_per_stage: auto`` needs prices, so it is balanced
after this check, on the main path (``mpsim/resolve.py``).

A schedule whose stages form several pipelines over the same layers (the bidirectional
DualPipe: two chains, ``mpsim/schedules/chains.py``) splits the layers into one block
per stage of a chain; ``layers_per_stage`` then has that many entries (``pp`` for
DualPipe) and every chain's ``k``-th stage holds block ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.errors import InputError
from mpsim.schedules.chains import StageChains
from mpsim.schedules.generators import microbatch_group_problem
from mpsim.schedules.registry import GROUPED, canonical_name, stage_chains
from mpsim.specs.scenario import Scenario
from mpsim.specs.stack import LayerStackSpec
from mpsim.specs.stack_tp import plan_tensor_parallel

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
    chains: tuple[int, ...] = ()  # stage chains of the schedule (mpsim/schedules/chains.py); (): one
    reshard_after_forward: bool = True  # ZeRO-3 / FSDP: gather the parameters again for the backward
    microbatch_group_size: int | None = None  # interleaved-1f1b's microbatches per chunk in a row; None: default

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
    def fsdp_whole_step(self) -> bool:
        """FSDP (ZeRO-3) driven by a pipeline schedule without resharding after the forward.

        torch.distributed.pipelining runs every backward but the last with FSDP's gradient
        sync and its resharding after the backward turned off (``backward_maybe_with_nosync``
        in torch/distributed/pipelining/stage.py: ``set_requires_gradient_sync(False)``,
        ``set_reshard_after_backward(False)``), and torchtitan, as Llama 3, does not reshard
        after the forward under a pipeline. So each model chunk's parameters are gathered
        once, before its first forward, and stay gathered for the step; its gradients
        accumulate unsharded (in the reduce dtype) and are reduce-scattered once, after its
        last backward. The step's collectives and memory are then ZeRO-1's
        (``state_zero_stage``).
        """
        return self.zero_stage >= 3 and self.pp > 1 and not self.reshard_after_forward

    @property
    def state_zero_stage(self) -> int:
        """The ZeRO stage the step's collectives and its memory follow: 1 for ``fsdp_whole_step``."""
        return 1 if self.fsdp_whole_step else self.zero_stage

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


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 64)


def resolve_layout(scenario: Scenario, chains: tuple[int, ...] | None = None) -> Layout:
    """Check the plan against the model and cluster; return the resolved layout.

    ``chains``: the stage chains of the schedule when known from elsewhere (a schedule
    file's directive); by default the registry says what the named schedule needs.

    ``layers_per_stage: auto`` resolves to a provisional even split marked
    ``layer_split="auto"``: balancing it needs the cost model, which is a step of the
    main path after this one (``mpsim/resolve.py``).
    """
    plan, system = scenario.parallel, scenario.cluster.system
    _check_tensor_parallel(scenario)
    _check_context_parallel(scenario)
    _check_deferred_head_wgrad(scenario)
    _check_userbuffers_sms(scenario)
    dp = _data_parallel_size(scenario)
    ep, etp = _expert_parallel_sizes(scenario, dp)
    zero, shard = _zero_sharding(scenario, dp, ep, etp)
    num_microbatches = _num_microbatches(scenario, dp)
    chains = stage_chains(plan.schedule, plan.pp, plan.vpp) if chains is None else chains
    layers, split = _layers_per_chunk(scenario, chains)
    order = _rank_order(scenario)
    _check_dtype(scenario)
    _check_microbatch_groups(scenario, num_microbatches)
    if plan.recompute_num_layers is not None and plan.recompute != "full":
        raise _fail("parallel.recompute_num_layers", f"recomputes whole layers, which needs parallel.recompute: "
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
        microbatch_group_size=plan.microbatch_group_size,
    )


def _fail(field: str, message: str) -> InputError:
    return InputError(message, field=field)


def _check_microbatch_groups(scenario: Scenario, num_microbatches: int) -> None:
    """Megatron-Core's microbatch groups: its interleaved schedule only, a size it accepts."""
    plan = scenario.parallel
    group = plan.microbatch_group_size
    if group is None:
        return
    field = "parallel.microbatch_group_size"
    if plan.schedule.startswith("file:") or canonical_name(plan.schedule) not in GROUPED:
        raise _fail(field, f"orders Megatron-Core's interleaved schedule ({', '.join(GROUPED)}); "
                           f"parallel.schedule is {plan.schedule} (leave it unset)")
    problem = microbatch_group_problem(plan.pp, num_microbatches, group)
    if problem:
        raise _fail(field, problem)


def _check_tensor_parallel(scenario: Scenario) -> None:
    """The model splits over ``tp`` (heads and FFN, or every layer of a stack); TP groups stay inside a node."""
    plan, model, system = scenario.parallel, scenario.model, scenario.cluster.system
    tp = plan.tp
    if isinstance(model, LayerStackSpec):
        # every layer needs a split at this tp (an LSTM has none); errors name the layer
        plan_tensor_parallel(model, tp, plan.sequence_parallel and tp > 1)
    else:
        _check_transformer(scenario)
    if tp > system.devices_per_node and not plan.allow_tp_across_nodes:
        per_node = system.devices_per_node
        raise _fail("parallel.tp", f"tp={tp} spans more than one {system.name} node ({per_node} "
                                   f"device{'s' if per_node != 1 else ''}); lower tp or set "
                                   f"parallel.allow_tp_across_nodes: true")
    if tp <= system.devices_per_node and system.devices_per_node % tp and not plan.allow_tp_across_nodes:
        raise _fail("parallel.tp", f"tp={tp} does not divide the {system.devices_per_node} devices of a node, so "
                                   f"some TP groups would straddle two nodes; use one of "
                                   f"{_divisors(system.devices_per_node)}")
    if model.moe is not None and tp > 1 and not plan.sequence_parallel:
        raise _fail("parallel.sequence_parallel", "mixture-of-experts layers with tp > 1 route sequence-parallel "
                                                  "shards of the tokens (as Megatron requires); set it to true")
    if scenario.training.tp_comm_overlap and tp > 1 and not plan.sequence_parallel:
        raise _fail("training.tp_comm_overlap", "overlaps the sequence-parallel all-gathers and reduce-scatters "
                                                "(Megatron-Core requires --sequence-parallel for --tp-comm-overlap); "
                                                "set parallel.sequence_parallel: true")


def _check_context_parallel(scenario: Scenario) -> None:
    """The sequence splits into the chunks context parallelism needs (and the heads, for all-to-all)."""
    plan, model = scenario.parallel, scenario.model
    tp, cp = plan.tp, plan.cp
    if cp == 1:
        return
    if isinstance(model, LayerStackSpec):
        raise _fail("parallel.cp", "context parallelism splits a transformer's sequence; layer stacks need cp=1")
    if scenario.training.attention != "flash":
        raise _fail("parallel.cp", "context parallelism needs the fused attention kernel; set training.attention: flash")
    chunks = 2 * cp if plan.cp_comm != "all-to-all" else cp
    if model.seq_length % chunks:
        raise _fail("parallel.cp", f"context parallelism splits the sequence into {chunks} chunks (load-balanced "
                                   f"for the causal mask), but seq_length={model.seq_length} is not divisible")
    if plan.cp_comm == "all-to-all" and model.num_attention_heads % (tp * cp):
        raise _fail("parallel.cp", f"all-to-all (Ulysses) context parallelism splits the heads over tp x cp = "
                                   f"{tp * cp}, which does not divide num_attention_heads={model.num_attention_heads}")
    if plan.sequence_parallel and (model.seq_length // cp) % tp:
        raise _fail("parallel.sequence_parallel", f"the {model.seq_length // cp} tokens of a context-parallel "
                                                  f"rank do not split over tp={tp}")


def _check_deferred_head_wgrad(scenario: Scenario) -> None:
    """Megatron-Core defers the LM head's weight gradients only where its pipeline drains them:
    a transformer's head, pipeline parallelism, its 1F1B and interleaved schedules, and
    gradients reduced once per step."""
    if not scenario.training.defer_embedding_wgrad:
        return
    plan, field = scenario.parallel, "training.defer_embedding_wgrad"
    if isinstance(scenario.model, LayerStackSpec):
        raise _fail(field, "defers a transformer's LM-head weight gradients; a layer stack has no LM head")
    if plan.pp == 1:
        raise _fail(field, "defers the LM head's weight gradients into the pipeline drain and needs parallel.pp > 1, "
                           "as Megatron-Core does")
    if canonical_name(plan.schedule) not in ("1f1b", "interleaved-1f1b"):
        raise _fail(field, f"Megatron-Core defers the LM head's weight gradients in its 1F1B and interleaved "
                           f"schedules, not in parallel.schedule={plan.schedule}")
    if plan.zero_stage >= 2:
        raise _fail(field, f"ZeRO-{plan.zero_stage} reduces every microbatch's gradients; the deferral needs them "
                           f"reduced once per step (zero_stage 0 or 1)")


def _check_userbuffers_sms(scenario: Scenario) -> None:
    """Userbuffers SMs fewer than the accelerator has (they take effect with training.tp_comm_overlap;
    without it NeMo ignores its ub_tp_comm_overlap_cfg, and so does mpsim)."""
    training, field = scenario.training, "training.tp_comm_overlap_sms"
    units = scenario.cluster.system.accelerator.compute_units
    for site, sms in training.tp_comm_overlap_sms.items():
        if units and sms >= units:
            raise _fail(field, f"{site} takes {sms} SMs, but the accelerator has {units} (compute_units)")


def _data_parallel_size(scenario: Scenario) -> int:
    """DP: the devices left over by tp x cp x pp, or the given value when it matches."""
    plan, devices = scenario.parallel, scenario.cluster.devices
    tp, cp, pp = plan.tp, plan.cp, plan.pp
    if devices % (tp * cp * pp):
        raise _fail("parallel", f"tp x cp x pp = {tp} x {cp} x {pp} = {tp * cp * pp} does not divide the cluster's "
                                f"{devices} devices")
    dp = plan.dp if plan.dp is not None else devices // (tp * cp * pp)
    if tp * cp * pp * dp != devices:
        raise _fail("parallel.dp", f"tp x cp x pp x dp = {tp * cp * pp * dp}, but the cluster has {devices} "
                                   f"devices; set dp={devices // (tp * cp * pp)} or omit it")
    return dp


def _expert_parallel_sizes(scenario: Scenario, dp: int) -> tuple[int, int]:
    """(ep, etp): experts spread over the data-parallel ranks, each expert split over etp (tp by default)."""
    plan, model = scenario.parallel, scenario.model
    ep = plan.ep
    etp = plan.etp if plan.etp is not None else plan.tp
    if (ep > 1 or plan.etp is not None) and model.moe is None:
        raise _fail("parallel.ep", "expert parallelism needs a mixture-of-experts model (model.moe)")
    if model.moe is not None:
        if model.moe.num_experts % ep:
            raise _fail("parallel.ep", f"ep={ep} does not divide the model's {model.moe.num_experts} experts")
        if (dp * plan.cp) % ep:
            raise _fail("parallel.ep", f"ep={ep} must divide dp x cp = {dp * plan.cp} (experts are spread over the "
                                       f"data-parallel ranks)")
        if plan.tp % etp or model.moe.expert_ffn_hidden_size % etp:
            raise _fail("parallel.etp", f"etp={etp} must divide tp={plan.tp} and moe.expert_ffn_hidden_size="
                                        f"{model.moe.expert_ffn_hidden_size}")
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
        raise _fail("parallel.zero_shard_size", f"{shard} does not divide dp={dp}")
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
        raise _fail("parallel.global_batch_size",
                    f"global_batch_size={plan.global_batch_size} is not divisible by dp x microbatch_size = "
                    f"{dp} x {plan.microbatch_size} = {per_step}{derived}")
    return plan.global_batch_size // per_step


def _layers_per_chunk(scenario: Scenario, chains: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """(layers of each stage in global stage order, how they were split: even, given or auto)."""
    plan, model = scenario.parallel, scenario.model
    if len(set(chains)) > 1:
        raise _fail("parallel.schedule", f"its pipelines (chains of {', '.join(map(str, chains))} stages) must be "
                                         f"equally long: each runs the whole model")
    # the layers split into blocks: one per stage, or one per stage of a chain when the
    # chains run the same blocks (each block then has a copy in every chain)
    num_chunks = plan.pp * plan.vpp // max(1, len(chains))
    split = "even" if plan.layers_per_stage is None else "auto" if plan.layers_per_stage == "auto" else "given"
    stack = isinstance(model, LayerStackSpec)
    what = "pipeline units (top-level layers, block repetitions)" if stack else "layers"
    ends = _embedding_and_loss_as_layers(scenario, split, stack)
    if split == "auto" and chains:
        raise _fail("parallel.layers_per_stage", f"auto balancing splits one pipeline; {plan.schedule} runs "
                                                 f"{len(chains)}, so give {num_chunks} block sizes or omit it")
    if split == "auto":
        if model.num_layers < num_chunks:
            raise _fail("parallel.layers_per_stage", f"the model has {model.num_layers} {what}, fewer than the "
                                                     f"pp x vpp = {num_chunks} model chunks to fill")
        # a provisional even split; mpsim/resolve.py replaces it once the layout can be priced
        base, extra = divmod(model.num_layers, num_chunks)
        layers = tuple(base + (1 if k < extra else 0) for k in range(num_chunks))
    elif split == "even" and ends != (0, 0):
        layers = _split_with_ends(model.num_layers, num_chunks, ends, plan.vpp if not chains else 1)
    elif split == "even":
        if model.num_layers % num_chunks:
            raise _fail("parallel.pp", f"{model.num_layers} {what} do not split evenly over "
                                       + (f"pp x vpp = {num_chunks} model chunks" if not chains else
                                          f"the {num_chunks} layer blocks of {plan.schedule}")
                                       + "; change pp/vpp or give parallel.layers_per_stage (a list, or auto)")
        layers = (model.num_layers // num_chunks,) * num_chunks
    else:
        layers = tuple(plan.layers_per_stage)
        if len(layers) != num_chunks:
            needs = f"pp x vpp = {num_chunks}" if not chains else f"one per layer block of {plan.schedule}: {num_chunks}"
            raise _fail("parallel.layers_per_stage", f"has {len(layers)} entries, needs {needs}")
        if any(n < 0 for n in layers):
            raise _fail("parallel.layers_per_stage", "layer counts must be >= 0")
        if sum(layers) != model.num_layers:
            raise _fail("parallel.layers_per_stage",
                        f"sums to {sum(layers)} layers, but the model has "
                        + (f"{model.num_layers} {what}" if stack else f"num_layers={model.num_layers}"))
    if chains:
        layers = tuple(layers[k] for length in chains for k in range(length))  # every chain holds every block
    return layers, split


EMBEDDING_FIELD = "parallel.account_for_embedding_in_pipeline_split"
LOSS_FIELD = "parallel.account_for_loss_in_pipeline_split"


def _embedding_and_loss_as_layers(scenario: Scenario, split: str, stack: bool) -> tuple[int, int]:
    """(1 if the embedding counts as a layer, 1 if the loss does) for the even split; checks the combinations."""
    plan = scenario.parallel
    ends = (int(plan.account_for_embedding_in_pipeline_split), int(plan.account_for_loss_in_pipeline_split))
    if ends == (0, 0):
        return ends
    field = EMBEDDING_FIELD if ends[0] else LOSS_FIELD
    if stack:
        raise _fail(field, "a layer stack's embedding and loss are pipeline units of their own already; "
                           "set it to false")
    if split != "even":
        # Megatron-Core refuses it with an explicit layout too (TransformerConfig.__post_init__)
        raise _fail(field, f"applies to the even split only; parallel.layers_per_stage is {split} here, so "
                           f"put the lighter first/last chunks into that list or omit it")
    return ends


def _split_with_ends(num_layers: int, num_chunks: int, ends: tuple[int, int], vpp: int) -> tuple[int, ...]:
    """Megatron-Core's even split with the embedding and/or loss counted as layers.

    As ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py): the
    layers plus one per counted end divide evenly over the pipeline ranks and then over
    each rank's ``vpp`` chunks; the first chunk builds one layer less for the embedding,
    the last one less for the loss.
    """
    total = num_layers + sum(ends)
    field = EMBEDDING_FIELD if ends[0] else LOSS_FIELD
    counted = " + ".join(["the embedding"] * ends[0] + ["the loss"] * ends[1])
    ranks = num_chunks // vpp
    if total % ranks or (total // ranks) % vpp:
        raise _fail(field, f"{num_layers} layers + {counted} = {total} do not split evenly over {num_chunks} model "
                           f"chunks ({ranks} pipeline ranks x {vpp}); change pp/vpp or set it to false")
    per_chunk = total // num_chunks
    layers = [per_chunk] * num_chunks
    layers[0] -= ends[0]
    layers[-1] -= ends[1]
    if min(layers) < 0:
        raise _fail(field, f"a model chunk of {per_chunk} layers cannot give one up for {counted}")
    return tuple(layers)


def _rank_order(scenario: Scenario) -> tuple[str, ...]:
    """The parallel dimensions from innermost to outermost rank, cp added beside tp when left out at size 1."""
    plan = scenario.parallel
    order = tuple(plan.order.split("-"))
    if "cp" not in order and plan.cp == 1 and "tp" in order:
        order = (*order[:order.index("tp") + 1], "cp", *order[order.index("tp") + 1:])  # a size-1 dimension
    if sorted(order) != sorted(ORDER_DIMS):
        raise _fail("parallel.order", f"{plan.order!r} must name each of {', '.join(ORDER_DIMS)} once, "
                                      f"innermost first, e.g. 'tp-cp-dp-pp'")
    return order


def _check_dtype(scenario: Scenario) -> None:
    accelerator = scenario.cluster.system.accelerator
    if scenario.training.fp8_params and scenario.training.dtype != "fp8":
        raise _fail("training.fp8_params", f"keeps the weights in fp8, which needs training.dtype: fp8 "
                                           f"(got {scenario.training.dtype})")
    training = scenario.training
    if training.transformer_impl in ("local", "pytorch") and (training.dtype == "fp8" or training.tp_comm_overlap):
        needs = "dtype: fp8" if training.dtype == "fp8" else "tp_comm_overlap"
        raise _fail("training.transformer_impl", f"{training.transformer_impl} cannot run training.{needs}, which "
                                                 f"only Transformer Engine implements; use transformer_engine")
    if training.cross_entropy_fusion and training.layers_impl == "pytorch":
        raise _fail("training.cross_entropy_fusion", "true runs Megatron-Core's fused cross entropy, which needs "
                                                     "Megatron's layers; transformer_impl pytorch computes the loss "
                                                     "with PyTorch's cross_entropy")
    if not training.fp32_loss and training.layers_impl != "pytorch":
        raise _fail("training.fp32_loss", f"false runs PyTorch's cross_entropy in the compute dtype; "
                                          f"transformer_impl {training.layers_impl} computes Megatron's cross "
                                          f"entropy, always on an fp32 copy of the logits")
    if training.fused_norm is False and scenario.model.norm != "rmsnorm":
        raise _fail("training.fused_norm", f"false prices RMSNorm's PyTorch operators; model.norm is "
                                           f"{scenario.model.norm}, which PyTorch runs as one kernel each way")
    kernel = training.attention_kernel
    if kernel is not None:
        if training.attention != "flash":
            raise _fail("training.attention_kernel", f"{kernel!r} picks a fused attention kernel, but "
                                                     f"training.attention is {training.attention}")
        if accelerator.efficiency.attention_kernel(kernel) is None:
            known = [sweep.id for sweep in accelerator.efficiency.attention_kernels() if sweep.id]
            carried = f"it carries {', '.join(known)}" if known else "it carries no measured attention kernel"
            raise _fail("training.attention_kernel", f"{accelerator.name} has no measured sweep of {kernel!r}; "
                                                     f"{carried}")
    if scenario.training.dtype not in accelerator.peak_flops:
        raise _fail("training.dtype", f"{scenario.training.dtype} has no peak_flops entry for {accelerator.name}; "
                                      f"use one of {', '.join(accelerator.peak_flops)}")


def _check_transformer(scenario: Scenario) -> None:
    """The transformer's tensor- and sequence-parallel rules (heads, FFN, sequence over tp)."""
    plan, model, tp = scenario.parallel, scenario.model, scenario.parallel.tp
    fail = _fail

    # the sizes to suggest split the query heads, the key/value heads and the FFN alike
    fitting = [d for d in range(1, model.kv_heads + 1)
               if model.num_attention_heads % d == 0 and model.kv_heads % d == 0 and model.ffn_hidden_size % d == 0]
    suggestion = ", ".join(map(str, fitting))
    if model.num_attention_heads % tp:
        raise fail("parallel.tp", f"tp={tp} does not divide model.num_attention_heads={model.num_attention_heads}; "
                                  f"use one of {suggestion}")
    if model.kv_heads % tp:
        raise fail("parallel.tp", f"tp={tp} does not divide the model's {model.kv_heads} key/value heads "
                                  f"(num_query_groups); use one of {suggestion}")
    if model.ffn_hidden_size % tp:
        raise fail("parallel.tp", f"tp={tp} does not divide model.ffn_hidden_size={model.ffn_hidden_size}; "
                                  f"use one of {suggestion}")
    if plan.sequence_parallel and model.seq_length % tp:
        raise fail("parallel.sequence_parallel",
                   f"sequence parallelism splits the sequence over tp={tp}, but seq_length={model.seq_length} "
                   f"is not divisible by it")
