"""The combinations of a scenario that a framework refuses at start-up, each as one line.

Pydantic checks each field on its own; the checks here take several fields together, as
Megatron-LM and Transformer Engine do when a run starts: tensor parallelism must divide the
heads and the FFN and stay inside a node, context parallelism must split the sequence,
fp8 needs Transformer Engine, a deferred LM-head gradient needs a pipeline that drains it.
A layer stack gets its own rules instead of the transformer's head and FFN rules: every
layer must have a tensor-parallel split at the chosen ``tp`` (``stack_tp.py``). Each
violation is an :class:`InputError` naming the field to change and how; the layout
(``layout.py``) runs them as it resolves the sizes, the microbatch-group check once it
knows the microbatch count.
"""

from __future__ import annotations

from mpsim.errors import InputError
from mpsim.schedules.generators import microbatch_group_problem
from mpsim.schedules.registry import GROUPED, canonical_name, combined_problem
from mpsim.specs.scenario import Scenario
from mpsim.specs.layers import NormLayer
from mpsim.specs.stack import LayerStackSpec, stack_units
from mpsim.specs.stack_tp import plan_tensor_parallel


def fail(field: str, message: str) -> InputError:
    return InputError(message, field=field)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 64)


def check_microbatch_groups(scenario: Scenario, num_microbatches: int) -> None:
    """Megatron-Core's microbatch groups: its interleaved schedule only, a size it accepts."""
    plan = scenario.parallel
    group = plan.microbatch_group_size
    if group is None:
        return
    field = "parallel.microbatch_group_size"
    if plan.schedule.startswith("file:") or canonical_name(plan.schedule) not in GROUPED:
        raise fail(field, f"orders Megatron-Core's interleaved schedule ({', '.join(GROUPED)}); "
                          f"parallel.schedule is {plan.schedule} (leave it unset)")
    problem = microbatch_group_problem(plan.pp, num_microbatches, group)
    if problem:
        raise fail(field, problem)


def check_combined_1f1b(scenario: Scenario, ep: int) -> None:
    """Megatron-Core's combined 1F1B where it runs: its interleaved schedule (or one rank), with
    expert parallelism, and without whole-layer recompute (TransformerConfig's checks of
    overlap_moe_expert_parallel_comm, megatron/core/transformer/transformer_config.py)."""
    plan = scenario.parallel
    if not scenario.training.overlap_moe_expert_parallel_comm:
        return
    field = "training.overlap_moe_expert_parallel_comm"
    if isinstance(scenario.model, LayerStackSpec) or scenario.model.moe is None or ep < 2:
        raise fail(field, "overlaps the all-to-alls of expert parallelism, which needs a mixture-of-experts model "
                          "(model.moe) and parallel.ep of 2 or more, as Megatron-Core requires")
    if plan.schedule.startswith("file:"):
        raise fail(field, "pairs the passes of Megatron-Core's generated schedule; a schedule file gives its own "
                          "pairs ((F;B)OVERLAP_F_B items): leave it unset")
    problem = combined_problem(canonical_name(plan.schedule), plan.pp, plan.vpp)
    if problem:
        raise fail(field, problem)
    if plan.recompute == "full":
        raise fail(field, "Megatron-Core refuses whole-layer recompute with it; set parallel.recompute to none "
                          "or selective")


def check_tensor_parallel(scenario: Scenario) -> None:
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
        raise fail("parallel.tp", f"tp={tp} spans more than one {system.name} node ({per_node} "
                                  f"device{'s' if per_node != 1 else ''}); lower tp or set "
                                  f"parallel.allow_tp_across_nodes: true")
    if tp <= system.devices_per_node and system.devices_per_node % tp and not plan.allow_tp_across_nodes:
        raise fail("parallel.tp", f"tp={tp} does not divide the {system.devices_per_node} devices of a node, so "
                                  f"some TP groups would straddle two nodes; use one of "
                                  f"{_divisors(system.devices_per_node)}")
    if model.moe is not None and tp > 1 and not plan.sequence_parallel:
        raise fail("parallel.sequence_parallel", "mixture-of-experts layers with tp > 1 route sequence-parallel "
                                                 "shards of the tokens (as Megatron requires); set it to true")
    if scenario.training.tp_comm_overlap and tp > 1 and not plan.sequence_parallel:
        raise fail("training.tp_comm_overlap", "overlaps the sequence-parallel all-gathers and reduce-scatters "
                                               "(Megatron-Core requires --sequence-parallel for --tp-comm-overlap); "
                                               "set parallel.sequence_parallel: true")


def check_moe_dispatch(scenario: Scenario) -> None:
    """A deduplicating MoE dispatcher needs MoE layers and an NVLink + RDMA machine (DeepEP's)."""
    training, model, system = scenario.training, scenario.model, scenario.cluster.system
    if training.moe_dispatch_fp8 and training.moe_token_dispatcher != "deepep":
        raise fail("training.moe_dispatch_fp8", "dispatches in fp8 through DeepEP's kernels; set "
                                                "training.moe_token_dispatcher: deepep")
    if training.moe_pad_to_capacity:
        if isinstance(model, LayerStackSpec) or model.moe is None or model.moe.capacity_factor is None:
            raise fail("training.moe_pad_to_capacity", "pads each expert's tokens to its capacity; set "
                                                       "model.moe.capacity_factor")
        if training.moe_token_dispatcher != "alltoall" or training.layers_impl == "pytorch":
            raise fail("training.moe_pad_to_capacity", "only Megatron-Core's alltoall dispatcher pads to capacity; "
                                                       "set moe_token_dispatcher: alltoall with Megatron's layers")
    dispatcher = training.moe_token_dispatcher
    if dispatcher == "alltoall":
        return
    if isinstance(model, LayerStackSpec) or model.moe is None:
        raise fail("training.moe_token_dispatcher", f"{dispatcher} dispatches the tokens of mixture-of-experts "
                                                    f"layers; the model has none (set model.moe or use alltoall)")
    if system.scale_up.topology == "torus":
        raise fail("training.moe_token_dispatcher", f"{dispatcher} forwards tokens over NVLink and RDMA; "
                                                    f"{system.name} is a torus (use alltoall)")
    if dispatcher == "hybridep" and training.layers_impl == "pytorch":
        raise fail("training.moe_token_dispatcher", "hybridep runs under Megatron-Core's flex dispatcher; "
                                                    "transformer_impl pytorch has no HybridEP path (use deepep "
                                                    "or alltoall)")
    units = system.accelerator.compute_units
    if training.moe_dispatch_sms > units:
        raise fail("training.moe_dispatch_sms", f"{training.moe_dispatch_sms} SMs, but the accelerator has {units} "
                                                f"(compute_units)")


def check_cuda_graphs(scenario: Scenario) -> None:
    """Per-layer CUDA graphs where Megatron-Core captures them (``TransformerConfig.__post_init__``'s
    checks of ``cuda_graph_modules``)."""
    training, model, plan = scenario.training, scenario.model, scenario.parallel
    modules = training.cuda_graph_modules
    if not modules:
        return
    field = "training.cuda_graph_modules"
    if training.layers_impl == "pytorch":
        raise fail(field, "captures Megatron-Core's transformer layers; transformer_impl pytorch has none "
                          "(use transformer_engine or local)")
    if plan.recompute in ("full", "selective-op"):
        raise fail(field, f"per-layer graphs run with recompute none or selective (Megatron-Core), not "
                          f"{plan.recompute}")
    if isinstance(model, LayerStackSpec):
        raise fail(field, "captures transformer layers; the model is a layer stack")
    moe = model.moe
    if moe is None and ({"moe_router", "moe_preprocess", "moe"} & set(modules)):
        raise fail(field, "moe_router, moe_preprocess and moe capture MoE layers; the model has none")
    if "moe_preprocess" in modules and "moe_router" not in modules:
        raise fail(field, "moe_preprocess is captured with moe_router (add moe_router)")
    if "moe" in modules and "moe_router" in modules:
        raise fail(field, "moe captures the whole MoE block, moe_router part of it: choose one")
    if moe is not None and "mlp" in modules and moe.dense_layers == 0:
        raise fail(field, "mlp captures dense layers' MLPs; every layer of the model is a MoE layer")
    if "moe" in modules and not training.moe_pad_to_capacity:
        raise fail(field, "moe captures a MoE block whose sizes are fixed: set training.moe_pad_to_capacity "
                          "(and model.moe.capacity_factor), or capture moe_router")
    if ("moe_preprocess" in modules and training.moe_token_dispatcher == "alltoall" and moe is not None
            and moe.capacity_factor is not None):
        raise fail(field, "moe_preprocess cannot be captured with a capacity factor: the alltoall dispatcher "
                          "reads the token counts back inside its preprocessing")


def check_recompute_modules(scenario: Scenario) -> None:
    """Megatron-Core's recompute modules with its selective recompute, on its transformer layers."""
    plan, model = scenario.parallel, scenario.model
    modules = plan.recompute_modules
    if modules is None:
        return
    field = "parallel.recompute_modules"
    if plan.recompute != "selective":
        raise fail(field, f"names what Megatron-Core's selective recompute runs again; set parallel.recompute: "
                          f"selective (got {plan.recompute})")
    if scenario.training.layers_impl == "pytorch":
        raise fail(field, "are Megatron-Core's; transformer_impl pytorch recomputes with parallel.recompute "
                          "(selective, selective-op or full)")
    if isinstance(model, LayerStackSpec):
        raise fail(field, "apply to transformer layers; the model is a layer stack")
    moe_modules = {"moe_act", "moe", "shared_experts"} & set(modules)
    if moe_modules and model.moe is None:
        raise fail(field, f"{', '.join(sorted(moe_modules))} recompute(s) MoE layers' parts; the model has no MoE "
                          f"layers")
    if "moe" in modules and ({"moe_act", "shared_experts"} & set(modules)):
        raise fail(field, "moe recomputes the whole MoE layer, moe_act and shared_experts included: name one")
    if "shared_experts" in modules and not model.moe.shared_experts:
        raise fail(field, "shared_experts recomputes the shared experts; the model's MoE layers have none")
    if "mlp" in modules and model.moe is not None and model.moe.dense_layers == 0:
        raise fail(field, "mlp recomputes dense layers' MLPs; every layer of the model is a MoE layer")
    if "mla_up_proj" in modules and model.mla is None:
        raise fail(field, "mla_up_proj recomputes multi-head latent attention's up projections; the model has "
                          "none (set model.mla)")
    if "moe" in modules and "moe_router" in scenario.training.cuda_graph_modules:
        raise fail(field, "moe recompute cannot run with the moe_router CUDA graph (Megatron-Core refuses it)")


def check_context_parallel(scenario: Scenario) -> None:
    """The sequence splits into the chunks context parallelism needs (and the heads, for all-to-all)."""
    plan, model = scenario.parallel, scenario.model
    tp, cp = plan.tp, plan.cp
    if cp == 1:
        return
    if isinstance(model, LayerStackSpec):
        raise fail("parallel.cp", "context parallelism splits a transformer's sequence; layer stacks need cp=1")
    if scenario.training.attention != "flash":
        raise fail("parallel.cp", "context parallelism needs the fused attention kernel; set training.attention: flash")
    chunks = 2 * cp if plan.cp_comm != "all-to-all" else cp
    if model.seq_length % chunks:
        raise fail("parallel.cp", f"context parallelism splits the sequence into {chunks} chunks (load-balanced "
                                  f"for the causal mask), but seq_length={model.seq_length} is not divisible")
    if plan.cp_comm == "all-to-all" and model.num_attention_heads % (tp * cp):
        raise fail("parallel.cp", f"all-to-all (Ulysses) context parallelism splits the heads over tp x cp = "
                                  f"{tp * cp}, which does not divide num_attention_heads={model.num_attention_heads}")
    if plan.sequence_parallel and (model.seq_length // cp) % tp:
        raise fail("parallel.sequence_parallel", f"the {model.seq_length // cp} tokens of a context-parallel "
                                                 f"rank do not split over tp={tp}")


def check_deferred_head_wgrad(scenario: Scenario) -> None:
    """Megatron-Core defers the LM head's weight gradients only where its pipeline drains them:
    a transformer's head, pipeline parallelism, its 1F1B and interleaved schedules, and
    gradients reduced once per step."""
    if not scenario.training.defer_embedding_wgrad:
        return
    plan, field = scenario.parallel, "training.defer_embedding_wgrad"
    if isinstance(scenario.model, LayerStackSpec):
        raise fail(field, "defers a transformer's LM-head weight gradients; a layer stack has no LM head")
    if plan.pp == 1:
        raise fail(field, "defers the LM head's weight gradients into the pipeline drain and needs parallel.pp > 1, "
                          "as Megatron-Core does")
    if canonical_name(plan.schedule) not in ("1f1b", "interleaved-1f1b"):
        raise fail(field, f"Megatron-Core defers the LM head's weight gradients in its 1F1B and interleaved "
                          f"schedules, not in parallel.schedule={plan.schedule}")
    if plan.zero_stage >= 2:
        raise fail(field, f"ZeRO-{plan.zero_stage} reduces every microbatch's gradients; the deferral needs them "
                          f"reduced once per step (zero_stage 0 or 1)")


def op_recompute_problem(model) -> str | None:
    """Why PyTorch's per-operator checkpointing as torchtitan's policy runs it (``recompute:
    selective-op``, which counts and keeps ``aten.mm`` outputs) does not fit ``model``, or None:
    it needs a dense transformer whose projections have no bias (an ``addmm`` it neither counts
    nor keeps) and whose attention is the standard one (``mpsim/workload/op_recompute.py``)."""
    if isinstance(model, LayerStackSpec):
        return "it follows the matmuls of a transformer block (query, key, value, output, FFN), not a layer stack's"
    if model.linear_bias:
        return "the model's projections have biases (model.linear_bias), which run as addmm, an op it neither " \
               "counts nor keeps"
    if model.moe is not None:
        return "the model's layers are mixture-of-experts (model.moe), whose grouped matmuls it does not count"
    if model.mla is not None:
        return "the model's attention is multi-head latent attention (model.mla), with matmuls of another pattern"
    return None


def check_op_recompute(scenario: Scenario) -> None:
    """``recompute: selective-op`` only where its pattern holds (:func:`op_recompute_problem`)."""
    if scenario.parallel.recompute != "selective-op":
        return
    problem = op_recompute_problem(scenario.model)
    if problem:
        raise fail("parallel.recompute", f"selective-op is torchtitan's per-op policy for dense Llama-style layers; "
                                         f"{problem}; use selective or full")


def check_userbuffers_sms(scenario: Scenario) -> None:
    """Userbuffers SMs fewer than the accelerator has (they take effect with training.tp_comm_overlap;
    without it NeMo ignores its ub_tp_comm_overlap_cfg, and so does mpsim)."""
    training, field = scenario.training, "training.tp_comm_overlap_sms"
    units = scenario.cluster.system.accelerator.compute_units
    for site, sms in training.tp_comm_overlap_sms.items():
        if units and sms >= units:
            raise fail(field, f"{site} takes {sms} SMs, but the accelerator has {units} (compute_units)")


def check_norms_as_operators(model) -> None:
    """``norm_kernel: operators`` prices RMSNorm as PyTorch's operators: every layer and block norm
    of the model must be an RMSNorm (a LayerNorm PyTorch runs as one kernel each way)."""
    if isinstance(model, LayerStackSpec):
        kinds = [(p.label, p.layer.kind) for unit in stack_units(model) for p in unit.layers
                 if isinstance(p.layer, NormLayer) and p.layer.kind in ("layernorm", "rmsnorm")]
        if not kinds:
            # nothing it would price: a setting that changes nothing is a mistake to name, not to ignore
            raise fail("training.norm_kernel", "operators prices RMSNorm's PyTorch operators, but the layer stack "
                                               "has no layernorm or rmsnorm layer (batchnorm and other norms keep "
                                               "their own kernels); leave norm_kernel out")
        other = next(((name, kind) for name, kind in kinds if kind != "rmsnorm"), None)
        found = f"layer {other[0]!r} is a {other[1]}" if other else None
    else:
        found = f"model.norm is {model.norm}" if model.norm != "rmsnorm" else None
    if found:
        raise fail("training.norm_kernel", f"operators prices RMSNorm's PyTorch operators; {found}, which PyTorch "
                                           f"runs as one kernel each way (norm_kernel: pytorch)")


def check_dtype(scenario: Scenario) -> None:
    accelerator = scenario.cluster.system.accelerator
    if scenario.training.fp8_params and scenario.training.dtype != "fp8":
        raise fail("training.fp8_params", f"keeps the weights in fp8, which needs training.dtype: fp8 "
                                          f"(got {scenario.training.dtype})")
    training = scenario.training
    if training.fp8_recipe != "delayed" and training.dtype != "fp8":
        raise fail("training.fp8_recipe", f"{training.fp8_recipe} scaling scales fp8 tensors, which needs "
                                          f"training.dtype: fp8 (got {training.dtype})")
    if training.transformer_impl in ("local", "pytorch") and (training.dtype == "fp8" or training.tp_comm_overlap):
        needs = "dtype: fp8" if training.dtype == "fp8" else "tp_comm_overlap"
        raise fail("training.transformer_impl", f"{training.transformer_impl} cannot run training.{needs}, which "
                                                f"only Transformer Engine implements; use transformer_engine")
    if training.cross_entropy_fusion and training.layers_impl == "pytorch":
        raise fail("training.cross_entropy_fusion", "true runs Megatron-Core's fused cross entropy, which needs "
                                                    "Megatron's layers; transformer_impl pytorch computes the loss "
                                                    "with PyTorch's cross_entropy")
    if not training.fp32_loss and training.layers_impl != "pytorch":
        raise fail("training.fp32_loss", f"false runs PyTorch's cross_entropy in the compute dtype; "
                                         f"transformer_impl {training.layers_impl} computes Megatron's cross "
                                         f"entropy, always on an fp32 copy of the logits")
    if training.norm_kernel == "operators":
        check_norms_as_operators(scenario.model)
    if training.ffn_projections == "separate":
        if training.layers_impl != "pytorch":
            raise fail("training.ffn_projections", f"separate writes the gate and the value as two linear layers, "
                                                   f"as plain PyTorch models do; transformer_impl "
                                                   f"{training.layers_impl} packs them in one FC1 GEMM")
        if isinstance(scenario.model, LayerStackSpec) or not scenario.model.gated_ffn:
            what = "a layer stack" if isinstance(scenario.model, LayerStackSpec) else \
                f"model.ffn_type {scenario.model.ffn_type}"
            raise fail("training.ffn_projections", f"separate splits a gated FFN (ffn_type swiglu) in two "
                                                   f"projections; {what} has none")
    kernel = training.attention_kernel
    if kernel is not None:
        if training.attention != "flash":
            raise fail("training.attention_kernel", f"{kernel!r} picks a fused attention kernel, but "
                                                    f"training.attention is {training.attention}")
        if accelerator.efficiency.attention_kernel(kernel) is None:
            known = [sweep.id for sweep in accelerator.efficiency.attention_kernels() if sweep.id]
            carried = f"it carries {', '.join(known)}" if known else "it carries no measured attention kernel"
            raise fail("training.attention_kernel", f"{accelerator.name} has no measured sweep of {kernel!r}; "
                                                    f"{carried}")
    if scenario.training.dtype not in accelerator.peak_flops:
        raise fail("training.dtype", f"{scenario.training.dtype} has no peak_flops entry for {accelerator.name}; "
                                     f"use one of {', '.join(accelerator.peak_flops)}")


def _check_transformer(scenario: Scenario) -> None:
    """The transformer's tensor- and sequence-parallel rules (heads, FFN, sequence over tp)."""
    plan, model, tp = scenario.parallel, scenario.model, scenario.parallel.tp

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
