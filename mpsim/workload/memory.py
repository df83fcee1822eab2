"""Memory per rank: model state (weights, gradients, optimizer) and activations.

Activations follow the tensors each block saves for its backward pass (see
``attention.py``, ``mlp.py``, ``moe.py``), which for a GPT layer with GeLU, full
multi-head attention and dropout gives exactly Korthikanti et al. 2022, Table 2:
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` bytes with TP, ``34*s*b*h/t`` with TP + SP +
selective recompute, ``2*s*b*h`` (``/t`` with SP) with full recompute.

Model state under ZeRO (Rajbhandari et al. 2020) shards over the ``shard`` data-parallel
ranks: stage 1 the optimizer state, stage 2 also the gradients, stage 3 (FSDP full
shard) also the weights.

Memory a training process holds besides its tensors (``reserved_parts``): the CUDA
context, cuBLAS's workspace and NCCL's communication buffers, each a named part with its
source, summed into ``training.memory_reserved: auto``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.transformer import LayerContext, layer_work

# optimizer state per parameter: fp32 master weight + Adam m and v, or bf16 m and v only
OPTIMIZER_BYTES_PER_PARAM = {"adam": 12, "adam-bf16": 4}
# of which the fp32 master weight
MASTER_BYTES_PER_PARAM = {"adam": 4, "adam-bf16": 0}
# ZeRO-3 / FSDP gathers the bf16 weights
GATHERED_PARAM_BYTES = 2


def layer_activation_bytes(ctx: LayerContext, recompute: str) -> float:
    """Bytes one dense MHA/GQA layer keeps from its forward until its backward, per microbatch."""
    return layer_work(ctx).activation_bytes(recompute)


@dataclass(frozen=True)
class ModelStateBytes:
    """Weights, gradients and optimizer state of the parameters one rank holds."""

    params: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes


def gathered_params_bytes(work) -> float:
    """Bytes of a stage's parameters gathered whole (``work``: a ``StageWork``), dense and expert."""
    return (work.params + work.expert_params) * GATHERED_PARAM_BYTES


def held_params(layout: Layout) -> bool:
    """Whether gathered ZeRO-3 parameters stay from a stage's forward to its backward."""
    return layout.state_zero_stage >= 3 and not layout.reshard_after_forward


def transient_buffers_bytes(largest_layer_params: float, activation_message: float, layout: Layout) -> float:
    """Transient communication buffers at a rank's peak: the largest of them is live at a time.

    Sequence parallelism gathers a layer's input whole (``activation_message`` bytes); under
    ZeRO-3 two layers are gathered at a time (the one computing and the one prefetched),
    except where the parameters are held from forward to backward or a pipeline runtime
    gathers whole chunks for passes that then gather nothing (FSDP's chunk window without
    ``reshard_after_forward``), which the memory walk counts instead.
    """
    gathered_input = activation_message if layout.tp > 1 and layout.sequence_parallel else 0.0
    whole_chunks = layout.fsdp_windowed and not layout.reshard_after_forward
    zero3_layers = 2 * largest_layer_params * GATHERED_PARAM_BYTES \
        if layout.weights_sharded and not held_params(layout) and not whole_chunks else 0.0
    return gathered_input + zero3_layers


def model_state_bytes(params: float, *, weight_bytes: int = 2, grad_bytes: int = 4, zero_stage: int = 0,
                      shard: int = 1, optimizer: str = "adam", shard_weights: bool | None = None,
                      master_is_shard: bool = False) -> ModelStateBytes:
    """Mixed-precision training state of ``params`` parameters, sharded per ZeRO stage over ``shard`` ranks.

    ``shard_weights``: whether the weights are sharded where it differs from the ZeRO stage's
    rule (FSDP under a pipeline: ``Layout.weights_sharded``); None: from ZeRO-3 on.
    ``master_is_shard``: sharded weights are the optimizer's fp32 master weights themselves, cast
    to ``weight_bytes`` only for the all-gather, as PyTorch's FSDP keeps them (its
    ``MixedPrecisionPolicy``: the optimizer steps the sharded parameter in its original dtype,
    so no separate low-precision shard is kept); else a low-precision shard beside the master
    (DeepSpeed's ZeRO-3 partitions).
    """
    sharded = zero_stage >= 3 if shard_weights is None else shard_weights
    optimizer_per_param = OPTIMIZER_BYTES_PER_PARAM[optimizer]
    if master_is_shard and sharded and MASTER_BYTES_PER_PARAM[optimizer]:
        weight_bytes = MASTER_BYTES_PER_PARAM[optimizer]
        optimizer_per_param -= weight_bytes
    optimizer_bytes = params * optimizer_per_param / (shard if zero_stage >= 1 else 1)
    grads = params * grad_bytes / (shard if zero_stage >= 2 else 1)
    weights = params * weight_bytes / (shard if sharded else 1)
    return ModelStateBytes(params, weights, grads, optimizer_bytes)


def model_state_options(scenario: Scenario, layout: Layout) -> dict:
    """:func:`model_state_bytes`'s settings for a scenario's layout, bar the parameters and the shard."""
    training = scenario.training
    return dict(grad_bytes=training.grad_bytes, zero_stage=layout.state_zero_stage, optimizer=training.optimizer,
                shard_weights=layout.weights_sharded, master_is_shard=scenario.parallel.zero_impl == "fsdp")


MiB = 2**20

# CUDA context of a PyTorch process with CUDA's lazy module loading (PyTorch's default since
# 1.13, pytorch/pytorch#86509): 287,047,680 bytes measured in that change (666,632,192 loading
# every kernel eagerly); ~300 MB confirmed by a PyTorch maintainer in pytorch/pytorch#107667
CUDA_CONTEXT_BYTES = 287_047_680
# cuBLAS workspace PyTorch allocates per handle and stream: 4096 KiB x 8 = 32 MiB on Hopper and
# newer, 8.125 MiB before (parseChosenWorkspaceSize, aten/src/ATen/cuda/CublasHandlePool.cpp);
# the larger one, for the compute stream
CUBLAS_WORKSPACE_BYTES = 32 * MiB
# NCCL's buffers per connection, one set per protocol (src/init.cc, DEFAULT_*_BUFFSIZE, with
# the constants of src/include/device.h): LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB,
# LL128 120 elements x 640 threads x 8 steps x 8 B = 4,915,200 B, Simple NCCL_BUFFSIZE = 4 MiB
# (its documented default, NCCL's environment-variable reference)
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8
NCCL_SIMPLE_BUFFER_BYTES = 4 * MiB
NCCL_CONNECTION_BYTES = NCCL_LL_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES + NCCL_SIMPLE_BUFFER_BYTES


def communicators(layout: Layout, moe: bool) -> tuple[tuple[str, int], ...]:
    """(name, size) of every process group a rank runs collectives or sends in, size > 1."""
    groups = [("tensor parallel", layout.tp), ("context parallel", layout.cp),
              ("data parallel", layout.dp * layout.cp), ("pipeline", layout.pp)]
    if layout.zero_stage >= 1 and layout.zero_shard_size < layout.dp:
        groups.append(("ZeRO replicas", layout.dp // layout.zero_shard_size))
    if moe:
        groups += [("expert parallel", layout.ep), ("expert data parallel", layout.expert_dp)]
        if layout.etp != layout.tp:
            groups.append(("expert tensor parallel", layout.etp))
    return tuple((name, size) for name, size in groups if size > 1)


def reserved_parts(scenario: Scenario, layout: Layout, system=None) -> tuple[tuple[str, float], ...]:
    """The memory a training process holds outside its tensors, part by part (name, bytes).

    ``training.memory_reserved`` set to a size is one part of that size. ``auto``: on
    NVIDIA devices the CUDA context and cuBLAS's workspace; on any system whose collectives
    run NCCL-style channels (``collective_channels`` > 0, NCCL or RCCL), one receive
    connection of LL, LL128 and Simple buffers per channel for each communicator the layout
    uses (a ring: each rank receives from one peer per channel). All-to-all groups connect
    to more peers and NVLink SHARP adds buffers of its own, so this is a floor for them.
    TPUs and other devices without such measurements get 0. ``system``: the part of a
    cluster of parts whose ranks are asked about (default: the cluster's first system).
    """
    training, system = scenario.training, system or scenario.cluster.system
    if training.memory_reserved != "auto":
        return (("memory_reserved", float(training.memory_reserved)),)
    parts: list[tuple[str, float]] = []
    if system.accelerator.vendor.lower() == "nvidia":
        parts += [("CUDA context", float(CUDA_CONTEXT_BYTES)), ("cuBLAS workspace", float(CUBLAS_WORKSPACE_BYTES))]
    channels = system.collective_channels
    groups = communicators(layout, scenario.model.moe is not None)
    if channels and groups:
        names = ", ".join(name for name, _ in groups)
        parts.append((f"NCCL buffers ({len(groups)} communicators: {names}; {channels} channels each)",
                      float(len(groups) * channels * NCCL_CONNECTION_BYTES)))
    return tuple(parts)


def reserved_bytes(scenario: Scenario, layout: Layout) -> float:
    """The sum of ``reserved_parts``."""
    return sum(size for _, size in reserved_parts(scenario, layout))
