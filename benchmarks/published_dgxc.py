"""NVIDIA's DGX Cloud benchmarking recipes (v24.11.1) for ``benchmarks/validate_published.py``.

Llama 3.1 8B and 70B and Nemotron-4 15B, BF16 and FP8, on 8 to 2,048 H100s in DGX H100
nodes, NeMo 24.09 / 24.11: the step time of each published recipe (38 rows), with the
framework's settings written as NeMo ran them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from published_common import SCENARIOS, Case, number, read_csv, step_prediction


# --- NVIDIA DGX Cloud benchmarking recipes v24.11.1 (NeMo 24.09 / 24.11 on DGX H100) ------------------------------
# Source: github.com/NVIDIA/dgxc-benchmarking at the release commit 35a9aec: the recipe files
# llama3.1/llama3.1_8b.yaml, llama3.1/llama3.1_70b.yaml, nemotron/nemotron4-15b-synth.yaml
# and the launch settings in llama3.1/configure.sh and nemotron/configure.sh. TP, PP, CP,
# virtual stages, microbatch, global batch, GPUs, sequence length, layers and precision
# come from the CSV row; the rest is below.
DGXC_BASE = SCENARIOS / "published" / "dgxc_h100.yaml"
DGXC_FRAMEWORK = [
    # NeMo builds its GPT models from Megatron-Core's Transformer Engine layer spec
    # (transformer_engine: true in the recipes), in BF16 as in FP8
    "training.transformer_impl=transformer_engine",
    # Transformer Engine attention with NVTE_FUSED_ATTN=1 (configure.sh): cuDNN's fused kernel
    "training.attention=flash",
    # activations_checkpoint_granularity: null -> no activation recompute
    "parallel.recompute=none",
    # optim.name: distributed_fused_adam (Apex's Adam with sharded state, reduce-scatter of the
    # gradients and all-gather of the parameters) -> mpsim's distributed optimizer (ZeRO-1)
    "training.distributed_optimizer=true",
    "training.optimizer=adam",  # megatron_amp_O2: true keeps fp32 master weights, m and v
    # optim.overlap_grad_sync: true
    "training.overlap_grad_reduce=true",
    # optim.grad_sync_dtype: bf16 with contiguous_grad_buffer: the weight-gradient GEMMs
    # accumulate into, and the reduce-scatter moves, a bf16 gradient buffer
    "training.fp32_grad_accumulation=false",
    # the backward input-gradient overlap (Megatron's default; the TP>1 recipes' userbuffers,
    # training.tp_comm_overlap below, overlap it too)
    "training.tp_comm_overlap_backward=true",
    # configure.sh exports NCCL_NVLS_ENABLE=0: no NVLink SHARP (in-switch reduction) collectives
    "cluster.system.scale_up.in_switch_reduction=null",
    # context parallelism: the recipes leave cp_comm_type unset, so Transformer Engine's default
    # p2p exchange of K/V around a ring
    "parallel.cp_comm=ring",
    # Megatron's rank order (tensor, context, data, pipeline from the innermost)
    "parallel.order=tp-cp-dp-pp",
    # optim.overlap_param_sync: true: Apex's sharded Adam all-gathers the updated parameters
    # bucket by bucket ahead of the next step's forward, as Megatron-Core's overlapped gather does
    "training.overlap_param_gather=true",
    # cross_entropy_loss_fusion: true in every recipe: Megatron-Core's fused vocab-parallel
    # cross entropy
    "training.cross_entropy_fusion=true",
]


@dataclass(frozen=True)
class Recipe:
    model: str  # scenarios/models file
    overrides: tuple[str, ...]
    gaps: tuple[str, ...]  # gaps of every row of the recipe


DGXC_RECIPES = {
    "Llama 3.1 8B": Recipe("llama3.1-8b", (
        "parallel.sequence_parallel=false",  # llama3.1_8b.yaml sequence_parallel: false (TP 1)
        "training.grad_reduce_bucket_bytes=75 MiB",  # optim.bucket_cap_mb: 75
        "training.pp_send_blocking=true",  # no pipeline in this recipe (PP 1); Megatron's default
    ), ()),
    "Llama 3.1 70B": Recipe("llama3.1-70b", (
        "parallel.sequence_parallel=true",  # llama3.1_70b.yaml sequence_parallel: true
        # ub_tp_comm_overlap: true: Transformer Engine's userbuffers overlap every sequence-parallel
        # collective with its GEMM, with the methods and SMs of the recipe's ub_tp_comm_overlap_cfg
        # (Transformer Engine's default methods; num_sm per site as below)
        "training.tp_comm_overlap=true",
        "training.tp_comm_overlap_sms={qkv_fprop: 1, qkv_dgrad: 4, qkv_wgrad: 24, proj_fprop: 24, proj_dgrad: 1, "
        "fc1_fprop: 1, fc1_dgrad: 2, fc1_wgrad: 4, fc2_fprop: 16, fc2_dgrad: 1}",
        "training.grad_reduce_bucket_bytes=75 MiB",  # optim.bucket_cap_mb: 75
        # overlap_p2p_comm: true, batch_p2p_comm: false: pipeline sends and receives overlap the
        # interleaved schedule's compute
        "training.pp_send_blocking=false",
        # defer_embedding_wgrad_compute: true, wgrad_deferral_limit: 22
        "training.defer_embedding_wgrad=true", "training.wgrad_deferral_limit=22",
    ), ()),
    "Nemotron-4 15B": Recipe("nemotron4-15b", (
        "parallel.sequence_parallel=true",  # configure.sh model.sequence_parallel=True
        "training.grad_reduce_bucket_bytes=100 MiB",  # optim.bucket_cap_mb: 100
        "training.pp_send_blocking=true",  # overlap_p2p_comm: False (and PP 1)
        "model.ffn_type=squared_relu",  # Nemotron-4's FFN activation (its model card)
        # bias_activation_fusion: false: NeMo's squared_relu (torch.pow(relu(x), 2)) runs eagerly
        "training.bias_activation_fusion=false",
        "training.tp_comm_overlap=true",  # configure.sh model.ub_tp_comm_overlap=True
        # rotary_percentage 0.5 rotates half of each head; Transformer Engine's fused RoPE kernel
        # (apply_rope_fusion) still reads and writes all of q and k, which is what mpsim prices
    ), ()),
}
# model.fp8 / fp8_hybrid / fp8_params from configure.sh when DTYPE=fp8 (Transformer Engine,
# E4M3 forward and E5M2 gradients: the layers' linear GEMMs in fp8, attention and the LM head
# in bf16, as mpsim's dtype fp8 prices them; fp8_params: the weights in fp8, gathered at 1 byte
# per parameter); model.precision bf16 otherwise
DGXC_PRECISION = {"BF16": (["training.dtype=bf16"], ()),
                  "FP8": (["training.dtype=fp8", "training.fp8_params=true"], ())}


def dgxc_table(data: Path) -> list[Case]:
    rows = read_csv(data / "nvidia_dgxc_benchmarks_v24.11_dense.csv")
    smallest: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row["model"], row["precision"])
        smallest[key] = min(smallest.get(key, 1 << 30), number(row["num_gpus"]))
    cases = []
    for row in rows:
        recipe = DGXC_RECIPES[row["model"]]
        precision, precision_gaps = DGXC_PRECISION[row["precision"]]
        gpus, tp, pp, cp = (number(row[k]) for k in ("num_gpus", "tp", "pp", "cp"))
        vpp = number(row["virtual_stages"]) if row["virtual_stages"].strip() else 1
        if gpus % 8:
            raise ValueError(f"{row['model']}: {gpus} GPUs is not a whole number of DGX H100 nodes")
        overrides = [
            f"model={recipe.model}",
            f"model.seq_length={number(row['seq_len'])}", f"model.num_layers={number(row['layers'])}",
            f"cluster.nodes={gpus // 8}",
            f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.cp={cp}", f"parallel.vpp={vpp}",
            f"parallel.dp={number(row['dp_as_stated'])}",  # checked against GPUs / (TP x PP x CP)
            f"parallel.schedule={'interleaved-1f1b' if vpp > 1 else '1f1b'}",  # Megatron's schedules
            f"parallel.microbatch_size={number(row['microbatch'])}",
            f"parallel.global_batch_size={number(row['global_batch'])}",
            *DGXC_FRAMEWORK, *recipe.overrides, *precision,
        ]
        notes = (*recipe.gaps, *precision_gaps)

        label = f"{row['model']} {row['precision']} {gpus} GPUs"
        cases.append(Case("dgxc_v24.11", label, float(row["step_time_s"]), step_prediction(DGXC_BASE, overrides),
                          notes,
                          quick=gpus == smallest[(row["model"], row["precision"])]))
    return cases
