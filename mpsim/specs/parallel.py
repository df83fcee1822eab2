"""The parallel layout of a job and the framework options that change its timing.

``ParallelPlan`` holds what a Megatron / torchtitan launch line says: TP, PP, DP,
virtual stages, microbatching, schedule, sequence parallelism and recompute.
``TrainingOptions`` holds the framework behaviours that swing predictions by 10-20 %
(overlap of communication, attention kernel, optimizer) with Megatron-LM's defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mpsim.specs.accelerator import DType
from mpsim.specs.base import Spec
from mpsim.units import Bytes


class ParallelPlan(Spec):
    """How the model and the batch are split over devices."""

    tp: int = Field(1, gt=0, description="tensor-parallel size")
    cp: int = Field(1, gt=0, description="context-parallel size: the sequence split over this many ranks")
    cp_comm: Literal["ring", "all-gather", "all-to-all"] = Field(
        "ring", description="how attention sees the whole sequence: KV ring (Megatron), KV all-gather (Llama 3), "
                            "head/sequence all-to-all (Ulysses)")
    pp: int = Field(1, gt=0, description="pipeline-parallel size")
    dp: int | None = Field(None, gt=0, description="data-parallel size; derived from the device count when omitted")
    ep: int = Field(1, gt=0, description="expert-parallel size (MoE), carved out of the data-parallel ranks")
    etp: int | None = Field(None, gt=0, description="expert tensor-parallel size; default: tp")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        0, description="shard optimizer state (1), + gradients (2), + parameters (3, FSDP full shard) over DP")
    zero_shard_size: int | None = Field(
        None, gt=0, description="shard within groups of this many DP ranks and replicate across them (hybrid shard)")
    vpp: int = Field(1, gt=0, description="virtual pipeline stages (model chunks) per pipeline rank")
    microbatch_size: int = Field(1, gt=0)
    global_batch_size: int = Field(gt=0, description="sequences per optimizer step, over all replicas")
    schedule: str = Field("1f1b", description="pipeline schedule name, or file:PATH of a schedule text file")
    sequence_parallel: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    layers_per_stage: list[int] | Literal["auto"] | None = Field(
        None, description="layers (transformer layers, or layer-stack units) of each model chunk, pp*vpp entries in "
                          "stage order; 'auto' balances the slowest stage within the memory limit; even by default"
    )
    order: str = Field("tp-cp-dp-pp", description="rank order, innermost first (Megatron's default is tp-cp-dp-pp)")
    allow_tp_across_nodes: bool = False

    @field_validator("layers_per_stage", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"expected a list of layer counts, one per model chunk, or auto (got {value!r})")
        return value


class TrainingOptions(Spec):
    """Framework behaviours; the defaults are Megatron-LM's."""

    dtype: DType = Field("bf16", description="compute dtype of GEMMs and activations")
    attention: Literal["flash", "unfused"] = Field(
        "flash", description="fused FlashAttention-style kernel, or Megatron's unfused QK^T/softmax/dropout/AV path"
    )
    tp_comm_overlap_backward: bool = Field(
        True, description="overlap the input-gradient TP collective with the weight-gradient GEMM (Megatron default)"
    )
    overlap_grad_reduce: bool = Field(True, description="reduce DP gradients in buckets during the last backward pass")
    grad_reduce_bucket_bytes: Bytes = Field(
        "160 MB", gt=0, description="DP gradient bucket (Megatron: 40M fp32 gradients)"
    )
    pp_scatter_gather: bool = Field(
        True, description="each TP rank sends 1/tp of the activation between stages (Megatron default)"
    )
    pp_send_blocking: bool = Field(
        True, description="a rank waits for its pipeline sends to finish before its next action (Megatron)"
    )
    network_contention: bool = Field(
        True, description="pipeline transfers and DP gradient buckets that share a link share its bandwidth")
    distributed_optimizer: bool = Field(
        False, description="Megatron's distributed optimizer: the same as parallel.zero_stage 1")
    fp32_grad_accumulation: bool = Field(True, description="gradients accumulated in fp32 (Megatron main_grad)")
    optimizer: Literal["adam", "adam-bf16"] = Field(
        "adam", description="adam: fp32 master weights, m and v (12 B/param); adam-bf16: bf16 m and v, no master (4 B)")
    memory_reserved: Bytes = Field(
        "0 B", ge=0, description="memory the framework holds outside tensors (CUDA context, NCCL, workspaces)")
    memory_fragmentation: float = Field(
        0.0, ge=0, lt=1, description="fraction of the allocator's peak lost to fragmentation")
