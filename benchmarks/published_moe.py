"""Published mixture-of-experts runs, an out-of-sample check for ``benchmarks/validate_published.py``.

``python benchmarks/validate_published.py --out-of-sample`` (or ``--table megatron_moe``)
adds NVIDIA's measured throughput of Qwen3 MoE models trained with Megatron-Core, turned
into a step time (global batch x sequence / tokens per second per GPU / GPUs); the rows are
in ``benchmarks/data/megatron_moe.csv`` with their sources:

- Megatron Bridge's performance summaries (NeMo 25.11 to 26.06) on DGX H100: Qwen3-235B-A22B
  on 256 GPUs and Qwen3-30B-A3B on 16, FP8 with current scaling, every H100 row of those two
  models whose settings the release's committed performance scripts determine (the scripts'
  workload base configs and per-GPU functions at the release's tag); two rows whose printed
  layout matches no committed configuration (NeMo 25.11's 30B, NeMo 26.02.01's 30B) are left out;
- the Megatron-Core MoE report (arXiv 2603.07685, Table 11, its Table 20 layouts and the
  settings of its Appendix B.2): Qwen3-235B-A22B in BF16 on 256 H100 and on 256 GB200, the two
  of its rows in a precision mpsim expresses (its MXFP8 and blockwise-FP8 rows are not, and its
  DeepSeek-V3 rows have a multi-token-prediction layer, which mpsim does not model).

The rows were chosen by those rules; one (NeMo 26.04.01's 235B) was priced while the
schedule these runs use, Megatron-Core's combined 1F1B, was being built. Every 235B row runs
it (``--overlap-moe-expert-parallel-comm``), with the expert groups folded over the tensor
parallel ranks (TP 2 and EP 32 on a stage of 32 GPUs leave expert TP 1). The framework
settings of every row are those of the DGX Cloud recipes (``published_dgxc.py``), where
Megatron Bridge's scripts agree, with the changes below, each beside its source.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from published_common import Case, Prediction, job_overrides, number, read_csv, simulate_step, step_breakdown
from published_dgxc import DGXC_BASE, DGXC_FRAMEWORK

CSV = Path(__file__).resolve().parent / "data" / "megatron_moe.csv"

MODELS = {"Qwen3-235B-A22B": "qwen3-235b-a22b", "Qwen3-30B-A3B": "qwen3-30b-a3b"}
SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-GB200": "gb200-nvl72"}
PRECISIONS = {
    # Megatron Bridge's fp8_cs (mixed_precision.py, bf16_with_fp8_current_scaling_mixed): hybrid fp8,
    # tensorwise current scaling, fp8 parameter gathers
    "FP8-CS": ("training.dtype=fp8", "training.fp8_recipe=current", "training.fp8_params=true"),
    "BF16": ("training.dtype=bf16",),
}
# the dispatchers: Megatron-Core's alltoall, and its flex dispatcher with DeepEP or HybridEP
# behind it, both of which send a token once per node it reaches and forward it over NVLink there
DISPATCHERS = {"alltoall": "alltoall", "deepep": "deepep", "hybridep": "hybridep"}

# gaps, named in a row's note column (printed under the tables with what each means)
GAPS = {
    "hybridep": "NVIDIA's HybridEP dispatcher: its host waits and fused permutation as Megatron-Core runs "
                "them, its traffic by DeepEP's deduplicating rule on the same number of SMs (no published "
                "bandwidth of HybridEP's own kernels)",
}

ASSUMPTIONS = (
    "framework settings of the DGX Cloud recipes (published_dgxc.py) where Megatron Bridge's performance "
    "scripts set nothing else: Transformer Engine layers and cuDNN attention, the distributed optimizer with "
    "overlapped gradient reduce-scatter and parameter all-gather, bf16 gradient reduction "
    "(grad_reduce_in_fp32 false), Megatron's rank order",
    "Megatron Bridge's scripts: no recompute, no tensor-parallel communication overlap (the 235B H100 "
    "function passes tp_comm_overlap false), sequence parallelism where TP > 1, router and permutation "
    "fusion, force-balanced routing (moe_router_force_load_balancing: every expert gets an even share), "
    "the embedding and the loss counted as a layer each in the 235B's pipeline split",
    "with the combined 1F1B Megatron-Core also delays the paired backward's weight gradients "
    "(delay_wgrad_compute) to hide the dispatch's gradient; mpsim pairs whole backwards",
    "QK-norm (per-head RMSNorm of queries and keys) and the router's auxiliary loss kernels are not modelled",
)


def predicted_moe_step(overrides: list[str]) -> Prediction:
    summary = simulate_step(DGXC_BASE, overrides)
    return Prediction(summary.step_time_s, step_breakdown(summary), {"ep": summary.exposed_ep_comm_s})


def megatron_moe_table(_data: Path) -> list[Case]:
    cases = []
    for row in read_csv(CSV):
        gpus, gbs, mbs, seq = (number(row[k]) for k in ("num_gpus", "global_batch", "microbatch", "seq_len"))
        tp, pp, vp, ep, etp = (number(row[k]) for k in ("tp", "pp", "vp", "ep", "etp"))
        model = MODELS[row["model"]]
        overrides = [
            *job_overrides(SYSTEMS[row["system"]], model, seq, gpus, mbs, gbs, tp=tp, pp=pp, vpp=vp, ep=ep, etp=etp),
            *DGXC_FRAMEWORK,
            f"parallel.sequence_parallel={str(tp > 1).lower()}", "training.tp_comm_overlap=false",
            # overlap_p2p_comm with the interleaved schedule (Megatron Bridge's default)
            f"training.pp_send_blocking={str(vp == 1).lower()}",
            f"training.moe_token_dispatcher={DISPATCHERS[row['dispatcher']]}",
            f"training.overlap_moe_expert_parallel_comm={row['ep_overlap']}",
            *PRECISIONS[row["precision"]],
        ]
        if row["dispatch_sms"]:
            # moe_hybridep_num_sms 32 in Megatron Bridge's scripts; DeepEP's 20 by default
            overrides.append(f"training.moe_dispatch_sms={number(row['dispatch_sms'])}")
        if model == "qwen3-235b-a22b":
            # account_for_embedding/loss_in_pipeline_split (Megatron Bridge's Qwen3-235B recipe):
            # 94 layers and the two count as 96 over PP x VP chunks
            overrides += ["parallel.layers_per_stage=null", "parallel.account_for_embedding_in_pipeline_split=true",
                          "parallel.account_for_loss_in_pipeline_split=true"]
        notes = []
        if row["dispatcher"] == "hybridep":
            notes.append("hybridep")
        if row["recompute_modules"]:
            # Megatron-Core's --recompute-granularity selective --recompute-modules (the report's Table 20)
            modules = ",".join(row["recompute_modules"].split())
            overrides += ["parallel.recompute=selective", f"parallel.recompute_modules=[{modules}]"]
        if row["release"].startswith("Megatron-Core"):
            # Appendix B.2: partial CUDA graphs of the attention, the router and the preprocessing
            overrides.append("training.cuda_graph_modules=[attn,moe_router,moe_preprocess]")
        step_s = gbs * seq / (float(row["tokens_per_s_per_gpu"]) * gpus)
        label = f"{row['model']} {row['precision']} {gpus}x {row['system'].split('-')[1]} {row['release']}"
        cases.append(Case("megatron_moe", label, step_s, partial(predicted_moe_step, overrides=overrides), tuple(notes),
                          quick=row["release"] in ("NeMo 26.04", "Megatron-Core 0.16") and row["system"] == "DGX-H100"))
    return cases
