"""The parallel layout of a job and the framework options that change its timing.

``ParallelPlan`` holds what a Megatron / torchtitan launch line says: TP, PP, DP,
virtual stages, microbatching, schedule, sequence parallelism and recompute.
``TrainingOptions`` holds the framework behaviours that swing predictions by 10-20 %
(overlap of communication, attention kernel, optimizer) with Megatron-LM's defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mpsim.specs.accelerator import DType
from mpsim.specs.base import Spec
from mpsim.units import Bytes


class ParallelPlan(Spec):
    """How the model and the batch are split over devices."""

    tp: int = Field(1, gt=0, description="tensor-parallel size")
    pp: int = Field(1, gt=0, description="pipeline-parallel size")
    dp: int | None = Field(None, gt=0, description="data-parallel size; derived from the device count when omitted")
    vpp: int = Field(1, gt=0, description="virtual pipeline stages (model chunks) per pipeline rank")
    microbatch_size: int = Field(1, gt=0)
    global_batch_size: int = Field(gt=0, description="sequences per optimizer step, over all replicas")
    schedule: str = Field("1f1b", description="pipeline schedule name, or file:PATH of a schedule text file")
    sequence_parallel: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    layers_per_stage: list[int] | None = Field(
        None, description="transformer layers of each model chunk, pp*vpp entries in stage order; even split by default"
    )
    order: str = Field("tp-dp-pp", description="rank order, innermost first (Megatron's default is tp-dp-pp)")
    allow_tp_across_nodes: bool = False


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
    distributed_optimizer: bool = Field(False, description="shard optimizer state over DP (ZeRO-1)")
    fp32_grad_accumulation: bool = Field(True, description="gradients accumulated in fp32 (Megatron main_grad)")
