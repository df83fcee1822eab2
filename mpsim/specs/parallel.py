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
from mpsim.specs.megatron_layout import layers_from_layout
from mpsim.units import Bytes, Seconds, parse_quantity


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
    # What a rank keeps of its sharded weights. PyTorch's FSDP keeps the shard in fp32 and steps it
    # in place, casting it to bf16 for each all-gather (MixedPrecisionPolicy: "FSDP does not require
    # any extra memory to keep a high-precision copy of the parameters for the optimizer step");
    # DeepSpeed's ZeRO-3 keeps a bf16 partition of the weights beside its fp32 master partition
    zero_impl: Literal["fsdp", "deepspeed"] = Field(
        "fsdp", description="ZeRO-3's sharded weights: fsdp (PyTorch's FSDP: the fp32 shard is the optimizer's "
                            "master weight) or deepspeed (a bf16 partition beside the fp32 master partition)")
    # FSDP2's fully_shard(reshard_after_forward=True) is PyTorch's default
    # (torch/distributed/fsdp/_fully_shard/_fully_shard.py); Llama 3 ran with False (Llama 3
    # report, Sec. 3.3.2: parameters not resharded after the forward, saving the backward's gather)
    reshard_after_forward: bool = Field(
        True, description="ZeRO-3 / FSDP: free the gathered parameters after the forward and gather them again "
                          "for the backward (FSDP2 default); false keeps them from forward to backward")
    # torchtitan wraps each block with fully_shard(reshard_after_forward=int(layer_id) <
    # len(model.layers) - 1): the last block's backward runs right after the LM head's, so FSDP
    # would gather it again at once ("As an optimization, do not reshard after forward for the
    # last transformer block", torchtitan/models/llama/parallelize_llama.py)
    reshard_last_layer: bool = Field(
        True, description="ZeRO-3 / FSDP with reshard_after_forward: free the model's last transformer layer after "
                          "its forward too (FSDP2 default); false keeps it gathered for its backward (torchtitan)")
    # torch.distributed.pipelining's runtime keeps at most 3 of a rank's chunks gathered under FSDP
    # (_add_unshard_reshard's max_active_stages, torch/distributed/pipelining/schedules.py); a
    # framework that keeps every chunk gathered (Llama 3's) is null
    fsdp_gathered_chunks: int | None = Field(
        3, gt=0, description="FSDP under a pipeline: most of a rank's chunks whose parameters stay gathered at "
                             "once, the others freed and gathered again (torch's pipeline runtime: 3); null: all")
    vpp: int = Field(1, gt=0, description="virtual pipeline stages (model chunks) per pipeline rank")
    microbatch_size: int = Field(1, gt=0)
    global_batch_size: int = Field(gt=0, description="sequences per optimizer step, over all replicas")
    schedule: str = Field("1f1b", description="pipeline schedule name, or file:PATH of a schedule text file")
    # Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage (ModelParallelConfig;
    # default pp): more microbatches per group run further ahead through the chunks, holding
    # more activations, and leave more compute between a chunk's sends and their use
    microbatch_group_size: int | None = Field(
        None, gt=0, description="interleaved-1f1b: microbatches each model chunk runs in a row before the next "
                                "chunk (Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage), from pp "
                                "to the microbatches per pipeline; default pp, or where pp does not divide the "
                                "microbatches, the count split evenly into microbatches // pp rounds (torch's)")
    sequence_parallel: bool = False
    # none; selective: Megatron's (the attention core's softmax, dropout and matmuls); full: every
    # layer's forward; selective-op: PyTorch's per-operator checkpointing as torchtitan's
    # selective_ac_option "op" runs it (mpsim/workload/op_recompute.py)
    recompute: Literal["none", "selective", "full", "selective-op"] = "none"
    # Megatron-Core's --recompute-modules with --recompute-granularity selective (TransformerConfig
    # .recompute_modules): core_attn, mlp, moe and shared_experts re-run their module from its
    # kept input; moe_act, layernorm and mla_up_proj discard the experts' activation's, the
    # separate norms' and MLA's up projections' outputs after their consumers ran and re-run them
    # before those backwards (CheckpointWithoutOutput)
    recompute_modules: list[Literal["core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts",
                                    "mla_up_proj"]] | None \
        = Field(None, description="with recompute selective: what each layer runs again (Megatron-Core's "
                                  "--recompute-modules): core_attn, moe_act (the experts' activation), layernorm (the "
                                  "norms that are modules of their own), mlp (a dense layer's MLP), moe (the whole "
                                  "MoE layer), shared_experts, mla_up_proj (MLA's up projections and rotary "
                                  "embedding); default [core_attn]")

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """What selective recompute runs again in each layer: ``recompute_modules`` (default
        core_attn), each once, in the order given; nothing under another recompute."""
        if self.recompute != "selective":
            return ()
        return ("core_attn",) if self.recompute_modules is None else tuple(dict.fromkeys(self.recompute_modules))

    # Megatron's --recompute-granularity full --recompute-method block --recompute-num-layers N: the
    # first N transformer layers of each model chunk recompute their forward, the rest keep their
    # activations (megatron/core/transformer/transformer_block.py, _checkpointed_forward)
    recompute_num_layers: int | None = Field(
        None, ge=1, description="with recompute full: only the first N transformer layers of each model chunk "
                                "recompute (Megatron's --recompute-method block --recompute-num-layers); "
                                "default: every layer")
    layers_per_stage: list[int] | Literal["auto"] | None = Field(
        None, description="layers (transformer layers, or layer-stack units) of each model chunk, pp*vpp entries in "
                          "stage order; or Megatron-Core's layout string (e.g. 'Et|(t*2|)*38,t*3L'); 'auto' "
                          "balances the slowest stage within the memory limit; even by default"
    )
    order: str = Field("tp-cp-dp-pp", description="rank order, innermost first (Megatron's default is tp-cp-dp-pp)")
    # Megatron-Core's options of the same names (TransformerConfig; applied in get_num_layers_to_build,
    # megatron/core/transformer/transformer_block.py): the embedding (the loss) counts as one more
    # layer when the layers are split evenly, and the first (last) model chunk builds one layer less
    account_for_embedding_in_pipeline_split: bool = Field(
        False, description="count the embedding as one layer when splitting layers evenly over the model chunks: "
                           "the first chunk gets one transformer layer less (Megatron-Core)")
    account_for_loss_in_pipeline_split: bool = Field(
        False, description="count the LM head and loss as one layer when splitting layers evenly over the model "
                           "chunks: the last chunk gets one transformer layer less (Megatron-Core)")
    allow_tp_across_nodes: bool = False

    @field_validator("layers_per_stage", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str) and value != "auto":
            if not set(value) & set("EL|"):  # no layout string has none of these (a mistyped auto, say)
                raise ValueError(f"expected a list of layer counts, one per model chunk, Megatron-Core's layout "
                                 f"string or auto (got {value!r})")
            return layers_from_layout(value)  # Megatron-Core's layout string (mpsim/specs/megatron_layout.py)
        return value


# Transformer Engine's userbuffers GEMM sites (transformer_engine/pytorch/module/base.py, initialize_ub)
UB_SITES = ("qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop", "proj_dgrad",
            "fc1_fprop", "fc1_dgrad", "fc1_wgrad", "fc2_fprop", "fc2_dgrad")


NormKernel = Literal["operators", "pytorch", "fused"]


def resolve_norm_kernel(setting: str | None, norm: str, layers_impl: str) -> str:
    """The kernel a norm of kind ``norm`` ("layernorm", "rmsnorm") runs as: ``setting``
    (``TrainingOptions.norm_kernel``) where given, else the layers' own: Megatron's and
    Transformer Engine's fused kernels; under plain PyTorch the model's module as written,
    RMSNorm in operators (Hugging Face's and torchtitan's), LayerNorm PyTorch's kernel."""
    if setting is not None:
        return setting
    if layers_impl != "pytorch":
        return "fused"
    return "operators" if norm == "rmsnorm" else "pytorch"


class TrainingOptions(Spec):
    """Framework behaviours; the defaults are Megatron-LM's."""

    @property
    def separate_ffn_projections(self) -> bool:
        """Whether a gated FFN's gate and value are two linear layers (``ffn_projections``)."""
        if self.ffn_projections is not None:
            return self.ffn_projections == "separate"
        return self.layers_impl == "pytorch"

    def norm_kernel_for(self, norm: str) -> str:
        """The kernel a norm of kind ``norm`` runs as (``norm_kernel``, or its default for the layers)."""
        return resolve_norm_kernel(self.norm_kernel, norm, self.layers_impl)

    @property
    def moe_expert_gemms(self) -> str:
        """``moe_grouped_gemm`` as the run uses it: as given, else Transformer Engine's
        multi-stream GEMMs where its layers run the experts, else one grouped kernel."""
        if self.moe_grouped_gemm is not None:
            return self.moe_grouped_gemm
        return "multi-stream" if self.layers_impl == "transformer_engine" else "grouped"

    @property
    def layers_impl(self) -> str:
        """``transformer_impl`` as the run uses it: as given, else Transformer Engine where the
        run needs it (fp8, userbuffers), else Megatron's local layers."""
        if self.transformer_impl is not None:
            return self.transformer_impl
        return "transformer_engine" if self.dtype == "fp8" or self.tp_comm_overlap else "local"

    dtype: DType = Field("bf16", description="compute dtype of GEMMs and activations; fp8 runs the layers' "
                                               "linear GEMMs in fp8 as Transformer Engine does, the rest in bf16")
    # Transformer Engine keeps dot-product attention in bf16 unless fp8_dpa is set (its
    # DelayedScaling recipe; NeMo's fp8 recipes leave it off)
    fp8_attention: bool = Field(False, description="with dtype fp8, run the attention core in fp8 too "
                                                   "(Transformer Engine's fp8_dpa)")
    # NeMo's fp8_params / Megatron-Core's --fp8-param-gather: the weights live as Transformer
    # Engine fp8 tensors, so the distributed optimizer all-gathers 1 byte per parameter. Memory
    # is left at 2 bytes per weight: the fp8 data and the transposed copy Hopper's fp8 GEMMs need
    fp8_params: bool = Field(False, description="with dtype fp8, keep the weights in fp8: the distributed "
                                                "optimizer's parameter all-gather moves 1 byte per parameter")
    # Transformer Engine's fp8 scaling recipes (transformer_engine/common/recipe): DelayedScaling
    # (its default; the scale from the amax history, reduced at the end of each fp8_autocast) or
    # Float8CurrentScaling (each tensor's own amax, taken before it is cast; Megatron-Core's
    # --fp8-recipe tensorwise, Megatron Bridge's "fp8_cs" recipes)
    fp8_recipe: Literal["delayed", "current"] = Field(
        "delayed", description="with dtype fp8: delayed scaling (Transformer Engine's default) or current "
                               "scaling (each tensor's amax taken as it is cast)")
    attention: Literal["flash", "unfused"] = Field(
        "flash", description="fused FlashAttention-style kernel, or Megatron's unfused QK^T/softmax/dropout/AV path"
    )
    # which fused kernel the framework calls: Transformer Engine runs cuDNN's on Hopper, the
    # flash-attn package (Hugging Face's flash_attention_2, many FSDP stacks) FlashAttention-2
    attention_kernel: str | None = Field(
        None, description="the fused attention kernel the run calls, by the id of a sweep its accelerator carries "
                          "(mpsim hardware show NAME lists them); unset: the accelerator file's attention_sweep")
    # Megatron's --transformer-impl: its own layers ("local", megatron/core/tensor_parallel/layers.py)
    # add the QKV projection's bias in an elementwise kernel after the GEMM (the other biases are
    # fused into bias-GeLU and bias-dropout-add) and sum each bias gradient over the tokens in a
    # reduction kernel; Transformer Engine's layers put both in the GEMMs' cuBLASLt epilogues
    # (BIAS, BGRADB). fp8 and userbuffers exist only in Transformer Engine, so they choose it.
    # Plain PyTorch modules ("pytorch": torch.nn.Linear under autograd, as the models mpsim
    # validate trains) add a bias in addmm's epilogue, sum its gradient in a reduction
    # (AddmmBackward0's sum), and write each weight gradient fresh for AccumulateGrad to add
    # into .grad (one aten::add_ per parameter per backward in a profiler trace)
    transformer_impl: Literal["local", "transformer_engine", "pytorch"] | None = Field(
        None, description="whose layers run the model: Megatron's --transformer-impl local (bias add and bias "
                          "gradient sums in kernels of their own) or transformer_engine (in the GEMM epilogues), "
                          "or pytorch (plain modules under autograd: biases in addmm, their gradients summed, and "
                          "each weight gradient added into .grad by a kernel of its own); default: "
                          "transformer_engine with dtype fp8 or tp_comm_overlap, else local")
    tp_comm_overlap_backward: bool = Field(
        True, description="overlap the input-gradient TP collective with the weight-gradient GEMM (Megatron default)"
    )
    # Megatron-Core's --tp-comm-overlap (off unless given; NeMo's ub_tp_comm_overlap): Transformer
    # Engine's userbuffers run each sequence-parallel all-gather as a ring exchange feeding the
    # GEMM piece by piece, pipeline each row-parallel GEMM with its reduce-scatter, and overlap
    # the backward's collectives in bulk on SMs of their own (transformer_engine/pytorch/module/
    # base.py, initialize_ub: the default method, pieces and SMs of each)
    tp_comm_overlap: bool = Field(
        False, description="overlap every sequence-parallel TP collective with its GEMM, forward and backward "
                           "(Megatron-Core --tp-comm-overlap with Transformer Engine's userbuffers); needs "
                           "parallel.sequence_parallel")
    # Transformer Engine's ub_cfgs (NeMo's ub_tp_comm_overlap_cfg): the SMs the userbuffers kernels
    # of each GEMM site take, where a recipe tunes them; a site not named keeps Transformer Engine's
    # default (1 for a ring exchange, 16 for a pipelined reduce-scatter or a bulk overlap)
    tp_comm_overlap_sms: dict[str, int] = Field(
        default_factory=dict, description="SMs of Transformer Engine's userbuffers per GEMM site (qkv_fprop, "
                                          "qkv_dgrad, qkv_wgrad, proj_fprop, proj_dgrad, fc1_fprop, fc1_dgrad, "
                                          "fc1_wgrad, fc2_fprop, fc2_dgrad: num_sm of ub_cfgs); others keep the "
                                          "defaults")
    # Megatron-LM's --overlap-grad-reduce is off unless given (megatron/training/arguments.py), but
    # its example launch scripts (e.g. examples/llama/train_llama3_8b_h100_fp8.sh) and the runs
    # the shipped scenarios model pass it: on here
    overlap_grad_reduce: bool = Field(
        True, description="reduce DP gradients in buckets during the last backward pass (Megatron's "
                          "--overlap-grad-reduce, which its example launch scripts set)")
    # Megatron-Core: a bucket holds max(40M, 1M x DP x CP) parameters (resolve_ddp_bucket_size in
    # megatron/training/training.py; DistributedDataParallelConfig.bucket_size), in the gradient
    # buffer's dtype; only pipeline rank 0's first model chunk is bucketed, the others reduce as one
    # bucket (megatron/training/training.py, per_chunk_disable_bucketing)
    grad_reduce_bucket_bytes: Bytes | None = Field(
        None, gt=0, description="DP gradient bucket; default: Megatron-Core's max(40M, 1M x dp x cp) gradients "
                                "(160 MB of fp32 gradients up to 40 data-parallel ranks)")
    # Megatron's --overlap-param-gather (off unless given; megatron/training/arguments.py): the
    # distributed optimizer's parameter all-gather runs bucket by bucket in the next step's forward,
    # each bucket waited for in the forward pre-hook of its first module, which starts the next
    # one (megatron/core/distributed/distributed_data_parallel.py, param_and_grad_buffer.py)
    overlap_param_gather: bool = Field(
        False, description="ZeRO-1/2 (distributed optimizer): all-gather the updated parameters bucket by bucket "
                           "during the next forward instead of after the optimizer step (Megatron's "
                           "--overlap-param-gather)")
    # DeepSeek-V3 (technical report, Sec. 3.2.1) overlaps a forward chunk's and a backward chunk's
    # compute with each other's all-to-all and pipeline communication; PyTorch's ScheduleDualPipeV
    # runs the two halves of an OVERLAP_F_B action one after the other unless a custom function is
    # registered for it (torch/distributed/pipelining/schedules.py, _PipelineScheduleRuntime)
    overlap_paired_passes: bool = Field(
        False, description="DualPipe/DualPipeV: the paired forward and backward hide each other's exposed "
                           "communication (DeepSeek's implementation); false runs them back to back (PyTorch)")
    # Megatron-Core's --overlap-moe-expert-parallel-comm (model_parallel_config.py; the schedule in
    # pipeline_parallel/schedules.py and combined_1f1b.py): one forward more in the interleaved
    # warm-up, then each steady-state forward runs with a backward of another microbatch as one
    # step, the expert all-to-alls of each on a communication stream beside the other's compute
    overlap_moe_expert_parallel_comm: bool = Field(
        False, description="Megatron-Core's combined 1F1B: pair each steady-state forward with a backward and "
                           "hide each one's expert all-to-alls under the other's compute (interleaved-1f1b, or "
                           "pp=1; needs expert parallelism)")
    # How MoE tokens travel to their experts. Megatron-Core's alltoall dispatcher permutes one copy
    # per (token, expert) and exchanges them in one NCCL all-to-all over the expert-parallel group;
    # DeepEP (its flex dispatcher with --moe-enable-deepep; DeepSeek-V3's own kernels) sends a token
    # once over the network to each node it reaches, then over NVLink once to each GPU there.
    # HybridEP (DeepEP's hybrid-ep branch, Megatron-Core's flex dispatcher with
    # --moe-flex-dispatcher-backend hybridep) sends the same way and permutes the tokens for
    # the experts inside its dispatch; mpsim prices its traffic by DeepEP's rule
    moe_token_dispatcher: Literal["alltoall", "deepep", "hybridep"] = Field(
        "alltoall", description="alltoall: one copy per token and expert (Megatron-Core's default); deepep: "
                                "one copy per node over the network, then per GPU over NVLink (DeepEP); "
                                "hybridep: the same traffic, the permutation inside the dispatch (HybridEP, "
                                "under Megatron-Core)")
    # DeepEP's high-throughput kernels run on Buffer.num_sms SMs, 20 by default (DeepEP's first
    # release, deep_ep/buffer.py at ebfe47e; DeepSeek-V3 technical report, Sec. 3.2.2: "only 20
    # SMs are sufficient to fully utilize the bandwidths of IB and NVLink")
    moe_dispatch_sms: int = Field(
        20, gt=0, description="SMs DeepEP's or HybridEP's dispatch and combine hold from the compute beside them "
                              "(moe_token_dispatcher: deepep or hybridep; DeepEP's Buffer.num_sms, Megatron-Core's "
                              "moe_flex_dispatcher_num_sms)")
    moe_dispatch_fp8: bool = Field(
        False, description="dispatch the tokens in fp8 and combine in bf16, as DeepSeek-V3 and DeepEP do "
                           "(needs moe_token_dispatcher: deepep)")
    # How the local experts' GEMMs run. Megatron-Core's TEGroupedMLP calls Transformer Engine's
    # GroupedLinear, whose default path launches one cuBLASLt GEMM per expert, round-robin over
    # 4 compute streams (multi_stream_cublas_gemm in common/gemm/cublaslt_gemm.cu, TE 2.x), each
    # with its own host-side heuristic call; under fp8 current scaling it quantizes each expert's
    # input and output gradient in four kernels (module/_split_quantization.py). A grouped
    # kernel (TE's NVTE_USE_CUTLASS_GROUPED_GEMM or grouped-tensor path, torch._grouped_mm,
    # Megatron's legacy grouped_gemm) launches one kernel for all of them
    moe_grouped_gemm: Literal["multi-stream", "grouped"] | None = Field(
        None, description="the local experts' GEMMs: multi-stream (one GEMM per expert over 4 streams, "
                          "Transformer Engine's GroupedLinear) or grouped (one kernel for all); default: "
                          "multi-stream under transformer_impl transformer_engine, else grouped")
    # Megatron-Core's per-layer CUDA graphs (--cuda-graph-impl transformer_engine or local with
    # --cuda-graph-modules; CudaGraphModule in megatron/core/transformer/transformer_config.py):
    # the captured parts of each layer are replayed with one launch (mpsim/workload/graphs.py)
    cuda_graph_modules: list[Literal["attn", "mlp", "moe_router", "moe_preprocess", "moe"]] = Field(
        default_factory=list, description="parts of every layer captured in CUDA graphs, each replayed with one "
                                          "launch (Megatron-Core's --cuda-graph-modules): attn, mlp (dense layers), "
                                          "moe_router (a MoE layer's norm, router and shared experts), "
                                          "moe_preprocess (with moe_router: the dispatcher's preprocessing), moe "
                                          "(a whole MoE block padded to capacity); empty: none")
    # Megatron-Core's --moe-pad-expert-input-to-capacity (token_dispatcher.py, drop_and_pad): every
    # expert's tokens are dropped or padded to its capacity, so the all-to-all's sizes are known
    # before the router runs and the host never waits for them (its cuda_sync_point stays
    # "no_sync"); the all-to-alls and the experts' GEMMs carry the full capacity
    moe_pad_to_capacity: bool = Field(
        False, description="pad every expert's tokens to its capacity (needs model.moe.capacity_factor and the "
                           "alltoall dispatcher): fixed sizes, no host wait per MoE layer, capacity_factor x "
                           "the mean tokens on every rank")
    # Megatron-Core's --cross-entropy-loss-fusion (off unless given; NeMo's recipes turn it on):
    # the vocab-parallel cross entropy's steps as three compiled functions instead of eager ops
    # (megatron/core/fusions/fused_cross_entropy.py)
    cross_entropy_fusion: bool = Field(
        False, description="the LM head's cross entropy in Megatron-Core's fused functions (--cross-entropy-loss-"
                           "fusion): fewer passes over the fp32 logits")
    # Where the loss runs: Megatron's cross entropy, torchtitan's model (its output layer's
    # ``.float()``) and Hugging Face's own loss (ForCausalLMLoss) take an fp32 copy of the logits; a
    # loss called on the logits a Hugging Face model returns (as cuDNN Frontend's Llama training
    # loop does) runs PyTorch's cross_entropy in the compute dtype
    fp32_loss: bool = Field(
        True, description="the loss on an fp32 copy of the logits (Megatron, torchtitan, Hugging Face's own loss); "
                          "false: PyTorch's cross_entropy on the logits in the compute dtype (transformer_impl "
                          "pytorch only)")
    # Megatron's --bias-activation-fusion (on unless --no-bias-gelu-fusion / --no-bias-swiglu-fusion):
    # bias and FFN activation in one fused kernel each way. Off, the model's activation runs as its
    # operators under autograd (SwiGLU as silu and a product, squared ReLU as relu and a power), as
    # NeMo's Nemotron-4 recipes run it (bias_activation_fusion: false)
    bias_activation_fusion: bool = Field(
        True, description="the FFN's bias and activation in one fused kernel each way (Megatron's default); "
                          "false runs SwiGLU and squared ReLU operator by operator")
    # A gated FFN's gate and value: Megatron and Transformer Engine pack both in one FC1 GEMM whose
    # output is cut in two (linear_fc1, 2 x ffn wide); plain PyTorch models mostly write two linear
    # layers of the same input (Hugging Face's LlamaMLP gate_proj / up_proj, torchtitan's w1 / w3),
    # some one packed layer cut by torch.chunk
    ffn_projections: Literal["packed", "separate"] | None = Field(
        None, description="a gated FFN's gate and value: packed (one FC1 GEMM cut in two) or separate (two "
                          "linear layers of the same input); default: separate under transformer_impl pytorch, "
                          "packed otherwise (Megatron's and Transformer Engine's layers always pack them)")
    # Three kinds of norm kernel run at measured shares of the streaming rate (mpsim/workload/norms.py):
    # a norm written in PyTorch operators and run eagerly (torchtitan's RMSNorm, norm_type "rmsnorm";
    # Hugging Face's LlamaRMSNorm): a kernel per operator, the input cast to fp32, squared, averaged,
    # rsqrt, scaled, cast back, multiplied by the weight, and as many again backward; PyTorch's own
    # fused kernels (nn.LayerNorm, nn.RMSNorm and F.rms_norm on CUDA); a hand-written or compiled one
    # (Apex, Transformer Engine, cuDNN, a Triton RMSNorm, torch.compile)
    norm_kernel: NormKernel | None = Field(
        None, description="the norm's kernels: operators (RMSNorm as PyTorch's operators, run eagerly; "
                          "docs/parallelism.md), pytorch (PyTorch's native fused kernel, nn.LayerNorm / "
                          "nn.RMSNorm), fused (Apex, Transformer Engine, cuDNN, Triton, torch.compile); default: "
                          "fused, except under transformer_impl pytorch: operators for RMSNorm, pytorch for "
                          "LayerNorm")
    # Megatron-Core's --defer-embedding-wgrad-compute and --wgrad-deferral-limit (off, and 0 = every
    # microbatch, unless given; NeMo's Llama recipes: on, 22): the LM head's weight-gradient GEMMs
    # of the first microbatches wait in a buffer until the rank's last backward
    # (mpsim/schedules/deferral.py)
    defer_embedding_wgrad: bool = Field(
        False, description="defer the LM head's weight-gradient GEMMs of the first wgrad_deferral_limit "
                           "microbatches to the pipeline drain (Megatron-Core --defer-embedding-wgrad-compute)")
    wgrad_deferral_limit: int = Field(
        0, ge=0, description="microbatches whose LM-head weight gradient is deferred; 0: all (Megatron-Core's "
                             "--wgrad-deferral-limit)")
    pp_scatter_gather: bool = Field(
        True, description="each TP rank sends 1/tp of the activation between stages (Megatron default)"
    )
    # Megatron's batched p2p (non-interleaved 1F1B) waits for every send before it goes on (true);
    # the Zero Bubble fork (zb_schedules.py, flush and schedule_f/schedule_b) fuses a pass's sends
    # with the receive the next pass consumes into one batch_isend_irecv and waits for the whole
    # batch before that pass, while a pass that receives nothing (a weight-gradient pass) goes on
    # at once ("with-receive"); false: the next action never waits for the rank's sends
    pp_send_blocking: bool | Literal["with-receive"] = Field(
        True, description="a rank waits for its pipeline sends to finish before its next action (true, Megatron's "
                          "batched p2p), before its next action that receives an input (with-receive: the Zero "
                          "Bubble fork's fused batches), or never (false)"
    )
    # Eager PyTorch launches every kernel from a CPU thread (framework Python, the dispatcher, the
    # CUDA runtime call). Measured: the median interval between consecutive kernel launches of
    # one thread inside profiled steps, pooled over the three published A100 training traces
    # (Holistic Trace Analysis test data; 20,071 intervals; 19, 30 and 91 us per trace):
    # python benchmarks/trace_variation.py, launch_interval_us. CUDA graphs launch a whole graph
    # at once: set 0 for a run captured in them.
    host_launch_interval: Seconds = Field(
        29e-6, ge=0, description="host time per kernel launch (framework, dispatcher, CUDA runtime); the GPU cannot "
                                 "start a kernel before the host has launched it (docs/parallelism.md)")
    # Megatron's batched pipeline p2p calls torch.cuda.synchronize() after batch_isend_irecv
    # (megatron/core/pipeline_parallel/p2p_communication.py, batch_p2p_sync, on by default; the
    # overlapped p2p of the interleaved schedule does not): the next pass starts on an empty queue
    host_sync_between_passes: bool = Field(
        False, description="the host waits for the GPU before every pass (Megatron's batched p2p with "
                           "batch_p2p_sync; pass timers that synchronize): each pass starts with nothing queued, "
                           "so the host's launches show until the GPU falls behind them")
    network_contention: bool = Field(
        True, description="pipeline transfers and DP gradient buckets that share a link share its bandwidth")
    distributed_optimizer: bool = Field(
        False, description="Megatron's distributed optimizer: the same as parallel.zero_stage 1")
    fp32_grad_accumulation: bool = Field(True, description="gradients accumulated in fp32 (Megatron main_grad)")
    # Megatron's --clip-grad defaults to 1.0 (megatron/training/arguments.py); NeMo's
    # gradient_clip_val too: the global gradient norm is reduced over every rank each step
    clip_grad: bool = Field(
        True, description="clip gradients by their global norm: one all-reduce of the norm over the ranks "
                          "holding distinct gradients before the update (Megatron's --clip-grad)")
    # Zero Bubble's --enable-optimizer-post-validation (Qi et al. 2024, Section 5; the authors'
    # fork of Megatron-LM, which allows it with --fp16 and its zero-bubble schedules): no barrier
    # before the update; each rank steps once its gradients are final and the ranks before it
    # have passed on their part of the norm, and checks the global norm and NaN flag inside the
    # next step's warm-up, rolling back in the rare step that fails (engine/consecutive.py)
    optimizer_post_validation: bool = Field(
        False, description="Zero Bubble's optimizer post-validation: each rank updates without waiting for the "
                           "global norm and NaN check and starts the next step, which runs under the last one's "
                           "cool-down; the step time is the period of a long run (docs/parallelism.md)")
    optimizer: Literal["adam", "adam-bf16"] = Field(
        "adam", description="adam: fp32 master weights, m and v (12 B/param); adam-bf16: bf16 m and v, no master (4 B)")
    memory_reserved: Literal["auto"] | float = Field(
        "auto", description="memory the process holds outside the model's tensors; auto: CUDA context, cuBLAS "
                            "workspace and NCCL buffers estimated from the system and layout (docs/parallelism.md)")
    memory_fragmentation: float = Field(
        0.0, ge=0, lt=1, description="fraction of the allocator's peak lost to fragmentation")

    @field_validator("tp_comm_overlap_sms")
    @classmethod
    def _ub_sites(cls, value: dict[str, int]) -> dict[str, int]:
        """Transformer Engine's GEMM site names, each with a whole number of SMs from 1."""
        for site, sms in value.items():
            if site not in UB_SITES:
                raise ValueError(f"{site!r} is not a userbuffers GEMM site; known: {', '.join(UB_SITES)}")
            if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
                raise ValueError(f"{site}: {sms!r} SMs; give a whole number from 1")
        return value

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element as accumulated and reduced: fp32 main grads, or bf16."""
        return 4 if self.fp32_grad_accumulation else 2

    @field_validator("pp_send_blocking", mode="before")
    @classmethod
    def _send_blocking(cls, value: object) -> object:
        """true, false or with-receive, nothing else (not 1 or 2)."""
        if isinstance(value, bool) or value == "with-receive":
            return value
        raise ValueError(f"expected true, false or with-receive, got {value!r}")

    @field_validator("memory_reserved", mode="before")
    @classmethod
    def _reserved(cls, value: object) -> object:
        """``auto``, or a size with its unit (``2 GiB``) that is not negative."""
        if value == "auto":
            return value
        try:
            size = parse_quantity(value, "bytes")
        except ValueError as exc:
            message = str(exc.args[0])
            raise ValueError(f"expected auto or {message[len('expected '):]}" if message.startswith("expected ")
                             else f"{message} (or auto)") from None
        if size < 0:
            raise ValueError(f"must be auto or a size of at least 0 B, got {value!r}")
        return size
