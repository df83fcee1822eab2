"""NVIDIA's NeMo performance summaries, an out-of-sample check for ``benchmarks/validate_published.py``.

``python benchmarks/validate_published.py --out-of-sample`` adds tables that are not in
the shared validation data and that nothing in mpsim was ever compared with before its
parameters were set: the FP8 pre-training rows NVIDIA published for NeMo 24.07 on DGX H100
and for NeMo 25.02 on DGX B200, and the data-parallel Llama rows of NeMo 25.11 on DGX H100,
B200 and GB200 and of NeMo 26.04.01 on DGX H100 and GB200 (Megatron-Bridge's summaries, FP8 with
current scaling), tokens per second per GPU turned into
a step time (global batch x sequence / tokens per second per GPU / GPUs). The rows are in
``benchmarks/data/nemo_performance_summary.csv`` with their source.

The summaries print the layout (GPUs, batch, microbatch, sequence, TP, PP, CP, VP, EP) and
nothing else. The framework settings are those of the nearest recipes whose settings are
published, named beside each: the DGX Cloud recipes of NeMo 24.09 (``published_dgxc.py``)
for the Llama and Nemotron rows, the NeMo launcher's GPT-3 FP8 performance configurations
for the GPT-3 rows. So these tables check mpsim less tightly than the shared ones, where
each row's recipe is known; what they add is other software releases, other models and
Blackwell, B200 and GB200. Left out: Nemotron 8B, 22B and 340B (no model file here), the MoE
rows, GPT-3 20B (its launcher configuration was not read); of 25.11, the rows trained with
Megatron's FSDP; of the later releases, every row but 26.04.01's data-parallel Llama rows in FP8
(the newest release that still prints the 70B on DGX H100: H100 70B and 405B, GB200 405B, chosen
before any was predicted; MXFP8 and NVFP4 have no recipe in mpsim).
"""

from __future__ import annotations

from pathlib import Path

from published_common import Case, job_overrides, number, read_csv, step_prediction
from published_dgxc import DGXC_BASE, DGXC_FRAMEWORK

CSV = Path(__file__).resolve().parent / "data" / "nemo_performance_summary.csv"

# the summaries' systems: DGX H100 is the dgxc base's own system; DGX B200 is eight B200 per
# node, NVLink 5 and eight 400 Gb/s NICs (hgx-b200); DGX GB200 is NVL72 racks (gb200-nvl72),
# a job's GPUs filling racks in order
SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-B200": "hgx-b200", "DGX-GB200": "gb200-nvl72"}

# Llama 2 (Touvron et al. 2023, Table 1 and the released configs): RMSNorm, SwiGLU, RoPE, no
# biases, untied embeddings like Llama 3, a 32,000-token vocabulary; multi-head attention at 7B
# and 13B, 8 key/value heads at 70B
LLAMA2 = {
    "LLAMA2-7B": ("llama3.1-8b", ("model.num_layers=32", "model.hidden_size=4096", "model.ffn_hidden_size=11008",
                                  "model.num_attention_heads=32", "model.num_query_groups=32",
                                  "model.vocab_size=32000")),
    "LLAMA2-13B": ("llama3.1-8b", ("model.num_layers=40", "model.hidden_size=5120", "model.ffn_hidden_size=13824",
                                   "model.num_attention_heads=40", "model.num_query_groups=40",
                                   "model.vocab_size=32000")),
    "LLAMA2-70B": ("llama3.1-70b", ("model.num_layers=80", "model.hidden_size=8192", "model.ffn_hidden_size=28672",
                                    "model.num_attention_heads=64", "model.num_query_groups=8",
                                    "model.vocab_size=32000")),
}

# GPT-3 as NVIDIA's NeMo launcher configures it for FP8 performance runs
# (NVIDIA/NeMo-Framework-Launcher, launcher_scripts/conf/training/gpt3/5b_fp8_performance.yaml and
# 175b_fp8_performance.yaml): GeLU FFN of 4 x hidden, LayerNorm, learned positions, biases, the
# output layer tied to the embedding, the GPT-2 BPE vocabulary, hidden and attention dropout
# 0.1, activations_checkpoint_granularity: selective, optim bucket_cap_mb 200 (5B) / 100 (175B);
# no cross_entropy_loss_fusion in the configuration read (nor in the dgxc GPT-3 recipe), so
# Megatron-Core's default: the eager cross entropy
GPT3_ARCH = ("model.ffn_type=gelu", "model.norm=layernorm", "model.position_embedding=learned",
             "model.linear_bias=true", "model.tied_embeddings=true", "model.vocab_size=50257", "model.dropout=0.1",
             "parallel.recompute=selective", "training.cross_entropy_fusion=false")
GPT3 = {
    "GPT3-5B": ("gpt3-175b", ("model.num_layers=24", "model.hidden_size=4096", "model.ffn_hidden_size=16384",
                              "model.num_attention_heads=32", *GPT3_ARCH, "training.grad_reduce_bucket_bytes=200 MiB")),
    "GPT3-175B": ("gpt3-175b", (*GPT3_ARCH, "training.grad_reduce_bucket_bytes=100 MiB")),
}

# the models of the dgxc recipes, with their recipe's model settings (not their layout)
DGXC_MODELS = {
    "LLAMA3-8B": ("llama3.1-8b", ()),
    # the recipe defers the LM head's weight gradients of 22 microbatches (wgrad_deferral_limit)
    "LLAMA3-70B": ("llama3.1-70b", ("training.defer_embedding_wgrad=true", "training.wgrad_deferral_limit=22")),
    # 126 layers over PP x VP = 64 chunks: NeMo's 405B recipe counts the embedding and the loss as
    # a layer each in the pipeline split (account_for_embedding/loss_in_pipeline_split)
    "LLAMA3-405B": ("llama3-405b", ("parallel.account_for_embedding_in_pipeline_split=true",
                                    "parallel.account_for_loss_in_pipeline_split=true",
                                    # llama3.1_405b.yaml: defer_embedding_wgrad_compute, limit 50
                                    "training.defer_embedding_wgrad=true", "training.wgrad_deferral_limit=50")),
    "Nemotron-15B": ("nemotron4-15b", ("model.ffn_type=squared_relu", "training.bias_activation_fusion=false")),
}

ASSUMPTIONS = (
    "framework settings of the nearest published recipes (the summaries print the layout only): "
    "the DGX Cloud recipes of NeMo 24.09 for Llama and Nemotron, the NeMo launcher's GPT-3 FP8 "
    "performance configurations for GPT-3",
    "FP8 as the dgxc recipes run it (Transformer Engine, fp8 parameters); the summaries do not say "
    "which scaling recipe each release used",
)
# NeMo 25.11's summary (Megatron-Bridge) names its recipe: FP8-CS, current scaling
ASSUMPTIONS_25_11 = (
    ASSUMPTIONS[0],
    "FP8 with current scaling as the summary names it (FP8-CS), with fp8 parameters as the dgxc recipes; "
    "the summary's Megatron-Bridge recipes are not read",
)
# NeMo 26.04.01's prints FP8, which its scripts run as fp8_cs (CURRENT_SCALING_FP8 below)
ASSUMPTIONS_26_04 = (
    ASSUMPTIONS[0],
    "FP8 with current scaling, the recipes' fp8_cs (the summary prints FP8), with fp8 parameters as the dgxc "
    "recipes; the summary's Megatron-Bridge recipes are not read",
)


# the same models as Megatron-Bridge's summaries (NeMo 25.09 on) name them
RENAMED = {"LLAMA3_8B": "LLAMA3-8B", "LLAMA3_70B": "LLAMA3-70B", "LLAMA3.1_405B": "LLAMA3-405B"}
# the summaries' precisions: FP8 (NeMo 24.07, 25.02: as the dgxc recipes run it, delayed
# scaling) and FP8-CS (NeMo 25.11: Transformer Engine's current scaling, one amax per tensor
# taken as it is cast)
PRECISIONS = {"FP8": ("training.dtype=fp8", "training.fp8_params=true"),
              "FP8-CS": ("training.dtype=fp8", "training.fp8_params=true", "training.fp8_recipe=current")}
# From 26.02 the summaries print FP8 for the recipes' fp8_cs: Megatron-Bridge's performance
# scripts offer bf16, fp8_cs, fp8_mx, fp8_sc and nvfp4, and list fp8_cs for these Llama layouts
# (scripts/performance/dump_perf_configs.py at 4ab94df); MXFP8 and NVFP4 are printed by name
CURRENT_SCALING_FP8 = {"NeMo 26.04.01"}


def _precision_settings(release: str, precision: str) -> tuple[str, ...]:
    if precision == "FP8" and release in CURRENT_SCALING_FP8:
        return PRECISIONS["FP8-CS"]
    return PRECISIONS[precision]


def _model_settings(model: str) -> tuple[str, tuple[str, ...]]:
    model = RENAMED.get(model, model)
    for table in (LLAMA2, GPT3, DGXC_MODELS):
        if model in table:
            return table[model]
    raise ValueError(f"{CSV.name}: model {model!r} has no settings in published_nemo.py")


def nemo_table(name: str, release: str, system: str):
    """The builder of table ``name``: the CSV's rows of one release on one system."""

    def build(_data: Path) -> list[Case]:
        rows = [r for r in read_csv(CSV) if r["release"] == release and r["system"] == system]
        fewest = min(number(r["num_gpus"]) for r in rows)
        cases = []
        for row in rows:
            gpus, gbs, mbs, seq = (number(row[k]) for k in ("num_gpus", "global_batch", "microbatch", "seq_len"))
            tp, pp, cp, vp, ep = (number(row[k]) for k in ("tp", "pp", "cp", "vp", "ep"))
            model, settings = _model_settings(row["model"])
            tensor = tp > 1
            overrides = [
                *job_overrides(SYSTEMS[system], model, seq, gpus, mbs, gbs, tp=tp, pp=pp, cp=cp, vpp=vp, ep=ep),
                *DGXC_FRAMEWORK,
                # the dgxc recipes: sequence parallel with userbuffers wherever TP > 1, overlapped
                # pipeline transfers with the interleaved schedule, 75 MiB gradient buckets
                f"parallel.sequence_parallel={str(tensor).lower()}", f"training.tp_comm_overlap={str(tensor).lower()}",
                f"training.pp_send_blocking={str(vp == 1).lower()}",
                "training.grad_reduce_bucket_bytes=75 MiB",
                *settings,
                *_precision_settings(release, row["precision"]),
            ]
            step_s = gbs * seq / (float(row["tokens_per_s_per_gpu"]) * gpus)

            label = f"{row['model']} {row['precision']} {gpus} GPUs"
            cases.append(Case(name, label, step_s, step_prediction(DGXC_BASE, overrides),
                              quick=gpus == fewest))
        return cases

    return build
