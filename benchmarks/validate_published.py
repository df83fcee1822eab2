"""Predict every published training run in the shared validation data and print the error.

The rows come from the CSV files of ``../shared/validation`` (the shared folder beside the
repository), read at run time: nothing measured is copied into this file. Each row is
written as an mpsim scenario the way its framework ran it (a base scenario file plus
``--set`` overrides, through the public loader), simulated, and summarized. Five tables:

* ``korthikanti_table5``: Korthikanti et al. 2022, Table 5 (configurations from their
  Table 3): iteration time of GPT 22B-1T on Selene (DGX A100), full recompute and
  sequence parallelism + selective recompute, Megatron-LM of 2022. 8 rows.
* ``korthikanti_table4``: their Table 4, forward and backward time of one 22B layer
  (TP 8, microbatch 4) under five recompute / sequence-parallel settings. One row per
  setting: the row's error is that of forward + backward (the time a step spends in the
  layer, and what the table's overhead column is relative to); the forward and backward
  times, measured and predicted, are printed beside it. The layer is priced with the cost
  model alone, as ``mpsim/balance/auto.py`` prices one layer (a one-layer stage without
  embedding or head), since the measurement is of one layer, not of a step. 5 rows.
* ``dgxc_v24.11``: NVIDIA's DGX Cloud benchmarking recipes, release v24.11.1: Llama 3.1
  8B and 70B and Nemotron-4 15B, BF16 and FP8, 8 to 2048 H100s, NeMo 24.09 / 24.11. Step
  time. 38 rows.
* ``zero_bubble_table4``: Qi et al. 2024 (Zero Bubble Pipeline Parallelism), Table 4:
  samples per second per GPU of 1F1B, interleaved 1F1B, ZB-1p and ZB-2p on A100 for the
  four setups of their Table 3, predicted from first principles (the model, the layout
  and mpsim's own costs and schedules; the paper's profiled pass times are not used).
  48 rows.
* ``zero_bubble_table9``: the same paper's Table 9, the fork's profiled forward (T_F),
  input-gradient (T_B) and weight-gradient (T_W) time of one pipeline stage per
  microbatch, the times its Table 5 bubble rates are computed from. The row's error is
  that of T_F + T_B + T_W; each pass, measured and predicted, is printed beside it. The
  passes are priced with the cost model alone, like Table 4 of Korthikanti. 12 rows.

Each table compares like with like: step time where the source printed step time,
throughput where it printed throughput; error = (predicted - measured) / measured in
percent. Beside each row is where the predicted step went, in seconds of the step (ms of
the layer for Table 4), from the Summary (``mpsim/results/metrics.py``, docs/json.md), as
a mean over pipeline ranks: compute (the ranks' actions less the TP/CP/EP collectives and
ZeRO gathers exposed in them), bubble (idle time of fill, drain and stage imbalance:
``bubble_s - bubble_comm_s``), exposed TP, CP, PP (``exposed_pp_comm_s``) and DP
(``exposed_dp_comm_s``) communication, and the optimizer step (``optimizer_s``, with the
distributed optimizer's parameter all-gather where it is not hidden). They add up to about
the step time (the step is the slowest rank's).

Every framework setting is in one commented block per source below, with where it comes
from. Where mpsim cannot express what the framework did, the row uses the nearest
setting, names the gap in its note column, and the gap is listed at the end under
"not expressible yet". Nothing here is fitted to any row.

After each table comes ``<table>: rows=<n> mean_abs_error_pct=.. max_abs_error_pct=..
mean_signed_error_pct=..``; the last line is ``tables=<n> rows=<n> mean_abs_error_pct=<x>
max_abs_error_pct=<y> mean_signed_error_pct=<z>`` over all rows. ``--quick`` runs the
smallest configurations of each source (the 22B rows of Table 5, all of Table 4, the
fewest GPUs of each dgxc model and precision, the 1.5B Zero Bubble setup at 24
microbatches, each Zero Bubble model's Table 9 passes once), for CI; ``tests/test_validate_published.py`` guards their errors.

Usage: python benchmarks/validate_published.py [--table NAME ...] [--quick] [--json FILE]
       [--data DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario
from mpsim.workload.embedding import padded_vocab
from mpsim.workload.stages import build_stage, layer_context, stage_options

ROOT = Path(__file__).resolve().parent.parent
# copies of the published tables (each row names its source in its first column), so the
# harness and its test run on a bare clone
DATA = Path(__file__).resolve().parent / "data"
SCENARIOS = ROOT / "scenarios"


# --- gaps: what the frameworks did that mpsim cannot express yet --------------------------------------------------
# key -> description. Rows name the keys that apply to them in their note column.
GAPS: dict[str, str] = {
    "defer-emb-wgrad": "defer_embedding_wgrad_compute: true defers the last stage's LM-head weight-gradient "
                       "GEMMs into the pipeline flush, where they fill its idle time; nearest: the GEMM in each "
                       "backward",
    "zb-ilp": "the paper's ZB-1p / ZB-2p refine the heuristic schedule with an ILP; mpsim's zb-1p / zb-2p run "
              "the heuristic as a search without it (docs/schedules.md); nearest: that",
    "post-validation": "the fork's optimizer post-validation (--enable-optimizer-post-validation with zero "
                       "bubble) drops the all-reduce before the optimizer step, so each stage starts its next "
                       "step once its own is done and consecutive steps overlap across stages; mpsim times one "
                       "step on its own, from the first action to the last rank's end; nearest: that",
}

# gaps of a whole table or of a kind of its rows, not marked row by row: table -> (which rows, gap)
TABLE_GAPS: dict[str, list[tuple[str, str]]] = {
    "zero_bubble_table4": [
        ("all rows", "the cluster is 'up to 4 nodes x 8 A100 SXM 80GB, RoCE RDMA' with no NIC bandwidth printed; "
                     "nearest: the shipped dgx-a100 system (8x HDR 200 Gb/s InfiniBand per node)"),
    ],
}


# --- rows, predictions, results -----------------------------------------------------------------------------------

@dataclass
class Prediction:
    value: float  # the quantity the source printed, in the table's unit
    breakdown: dict[str, float]  # compute, bubble, tp, cp, pp, dp, optimizer (seconds, or the table's unit)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Case:
    """One published row: what was measured, how to predict it, and its gaps."""

    table: str
    label: str
    measured: float
    predict: Callable[[], Prediction]
    notes: tuple[str, ...] = ()
    quick: bool = False


@dataclass
class Result:
    table: str
    label: str
    measured: float
    predicted: float | None
    error_pct: float | None
    breakdown: dict[str, float]
    extra: dict[str, float]
    notes: tuple[str, ...]
    failure: str | None = None


@dataclass(frozen=True)
class Table:
    title: str
    quantity: str  # what measured / predicted are
    unit: str  # of measured / predicted
    breakdown_unit: str
    build: Callable[[Path], list[Case]]
    extra_columns: tuple[tuple[str, str], ...] = ()  # (header, key of Prediction.extra)
    assumptions: tuple[str, ...] = ()  # fields the source left out, printed under the table


BREAKDOWN = ("compute", "bubble", "tp", "cp", "pp", "dp", "optimizer")
# what a table's breakdown splits, where it is not a step
PREDICTED_UNIT = {"korthikanti_table4": "layer", "zero_bubble_table9": "stage's passes"}


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def step_breakdown(summary) -> dict[str, float]:
    """Where the step went, in seconds (means over pipeline ranks, from the Summary)."""
    ranks = summary.ranks
    inside = sum(r.compute_s - r.tp_comm_exposed_s - r.cp_comm_exposed_s - r.ep_comm_exposed_s
                 - r.zero_gather_exposed_s for r in ranks) / len(ranks)
    return {"compute": inside, "bubble": summary.bubble_s - summary.bubble_comm_s,
            "tp": summary.exposed_tp_comm_s, "cp": summary.exposed_cp_comm_s, "pp": summary.exposed_pp_comm_s,
            "dp": summary.exposed_dp_comm_s, "optimizer": summary.optimizer_s}


def simulate_step(base: Path, overrides: list[str]):
    """Load, simulate and summarize one scenario (with the reference run that splits the bubble)."""
    scenario = load_scenario(base, overrides).scenario
    result = simulate(scenario)
    return summarize(result, bubble_reference(result))


# --- Korthikanti et al. 2022: Megatron-LM of 2022 on Selene (DGX A100) --------------------------------------------
# Configurations: Table 3 (TP, PP, DP, microbatch, global batch, interleaving) from the CSV;
# models: scenarios/models/megatron_22b.yaml, gpt3_175b.yaml, megatron_530b.yaml, megatron_1t.yaml;
# hardware: the shipped dgx-a100 (Selene is a DGX A100 SuperPOD). benchmarks/validate_korthikanti.py
# builds its rows with korthikanti_overrides below, so both print the same numbers.
KORTHIKANTI_BASE = SCENARIOS / "megatron_22b_8xa100.yaml"
KORTHIKANTI_MODELS = {"22B": "megatron-22b", "175B (GPT-3)": "gpt3-175b", "530B (MT-NLG)": "megatron-530b",
                      "1T": "megatron-1t"}
# The two settings of Table 5: the baseline is TP with full recompute; the "present work"
# adds sequence parallelism and selective recompute (of the attention core).
KORTHIKANTI_MODES = {"full recompute": ["parallel.recompute=full", "parallel.sequence_parallel=false"],
                     "SP + selective": ["parallel.recompute=selective", "parallel.sequence_parallel=true"]}
KORTHIKANTI_FRAMEWORK = [
    # Megatron-LM of 2022: its own layers (Transformer Engine did not exist yet), Apex's fused
    # layer norm
    "training.transformer_impl=local",
    # Megatron-LM of 2022 had no fused (flash) attention: QK^T, softmax, dropout and AV ran
    # as separate kernels (--use-flash-attn came later)
    "training.attention=unfused",
    # mixed precision on A100; the paper does not say fp16 or bf16, which run at the same peak;
    # bf16 as in scenarios/megatron_22b_8xa100.yaml
    "training.dtype=bf16",
    # Megatron's asynchronous TP all-reduce (--async-tensor-model-parallel-allreduce, on by
    # default) overlaps the input-gradient collective with the weight-gradient GEMM; with
    # sequence parallelism its reduce-scatter overlaps the weight-gradient GEMM the same way
    "training.tp_comm_overlap_backward=true",
    # pipeline sends: batched isend/irecv waited for before the next pass (Megatron's
    # p2p_communication; the overlapped pipeline communication of later versions did not exist)
    "training.pp_send_blocking=true",
    # ... followed by torch.cuda.synchronize() "to protect against race condition when using
    # batch_isend_irecv()" (p2p_communication._communicate): every pass starts on an empty queue
    "training.host_sync_between_passes=true",
    # scatter/gather of pipeline activations over the TP ranks (Narayanan et al. 2021, Sec. 4.1)
    "training.pp_scatter_gather=true",
    # Megatron-LM of 2022 all-reduced the gradients after the backward pass, without a
    # distributed optimizer; DP is 1 in every row, so neither changes these rows
    "training.overlap_grad_reduce=false",
    "training.distributed_optimizer=false",
    # bf16 training accumulated and reduced gradients in fp32 (Megatron forces
    # --accumulate-allreduce-grads-in-fp32 with --bf16)
    "training.fp32_grad_accumulation=true",
]


def korthikanti_overrides(row: dict[str, str]) -> list[str]:
    """A Table 3 row as --set overrides of the DGX A100 22B scenario (the mode's settings not included)."""
    vpp = int(row["virtual_stages"].split()[0]) if row["virtual_stages"].strip() else 1
    return [
        f"model={KORTHIKANTI_MODELS[row['model']]}",
        f"cluster.nodes={int(row['num_gpus']) // 8}",
        f"parallel.tp={row['tp']}", f"parallel.pp={row['pp']}", f"parallel.dp={row['dp']}",
        f"parallel.vpp={vpp}",
        f"parallel.schedule={'interleaved-1f1b' if vpp > 1 else '1f1b'}",
        f"parallel.microbatch_size={row['microbatch']}",
        f"parallel.global_batch_size={row['global_batch']}",
        *KORTHIKANTI_FRAMEWORK,
    ]


def korthikanti_table5(data: Path) -> list[Case]:
    rows = read_csv(data / "korthikanti2022_tables3_5.csv")
    smallest = min(int(r["num_gpus"]) for r in rows)
    cases = []
    for row in rows:
        for mode, column in (("full recompute", "iter_time_full_recompute_s"),
                             ("SP + selective", "iter_time_sp_plus_selective_s")):
            overrides = korthikanti_overrides(row) + KORTHIKANTI_MODES[mode]

            def predict(overrides=overrides) -> Prediction:
                summary = simulate_step(KORTHIKANTI_BASE, overrides)
                return Prediction(summary.step_time_s, step_breakdown(summary))

            cases.append(Case("korthikanti_table5", f"{row['model']} {mode} ({row['num_gpus']} GPUs)",
                              float(row[column]), predict, quick=int(row["num_gpus"]) == smallest))
    return cases


# Table 4's settings, by the name the table gives them: (recompute, sequence parallelism)
KORTHIKANTI_LAYER_SETTINGS = {
    "Baseline no recompute": ("none", False),
    "Sequence parallelism": ("none", True),
    "Baseline with full recompute": ("full", False),
    "Selective recompute": ("selective", False),
    "Selective recompute + sequence parallelism": ("selective", True),
}


def _config_value(config: str, name: str) -> int:
    """An ``a=64``-style value from the table's configuration text."""
    match = re.search(rf"\b{name}=(\d+)", config)
    if match is None:
        raise ValueError(f"no {name}= in the configuration {config!r}")
    return int(match.group(1))


def middle_stage(base: Path, overrides: list[str], layers: int):
    """The work of a pipeline stage of ``layers`` transformer layers (no embedding, no head) on
    one rank, and the cost model that prices it, as auto balancing builds them."""
    scenario = load_scenario(base, overrides).scenario
    layout = resolve(scenario)
    ctx = layer_context(scenario, layout)
    options = stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp))
    return build_stage(ctx, layers, layers, False, False, options), CostModel(scenario, layout)


def price_one_layer(overrides: list[str]) -> Prediction:
    """Forward and backward of one transformer layer on one rank, in ms, priced as auto balancing does."""
    work, model = middle_stage(KORTHIKANTI_BASE, overrides, 1)
    forward, backward = model.price(work.forward), model.price(work.backward)
    exposed = {group: forward.exposed(group) + backward.exposed(group) for group in ("tp", "cp")}
    total = forward.duration_s + backward.duration_s
    ms = 1e3
    return Prediction(total * ms, {"compute": (total - exposed["tp"] - exposed["cp"]) * ms,
                                   "tp": exposed["tp"] * ms, "cp": exposed["cp"] * ms},
                      {"fwd_pred": forward.duration_s * ms, "bwd_pred": backward.duration_s * ms})


def korthikanti_table4(data: Path) -> list[Case]:
    cases = []
    for row in read_csv(data / "korthikanti2022_table4_layer_timing.csv"):
        recompute, sp = KORTHIKANTI_LAYER_SETTINGS[row["experiment"]]
        config = row["config"]
        overrides = [f"model={KORTHIKANTI_MODELS[row['model']]}", "cluster.nodes=1",
                     f"parallel.tp={_config_value(config, 't')}", "parallel.pp=1",
                     f"parallel.microbatch_size={_config_value(config, 'b')}",
                     f"parallel.global_batch_size={_config_value(config, 'b')}",
                     f"parallel.recompute={recompute}", f"parallel.sequence_parallel={str(sp).lower()}",
                     *KORTHIKANTI_FRAMEWORK]
        # the layer the table timed: heads, hidden and sequence from its configuration text
        for name, field_name in (("a", "num_attention_heads"), ("h", "hidden_size"), ("s", "seq_length")):
            overrides.append(f"model.{field_name}={_config_value(config, name)}")
        measured_fwd, measured_bwd = float(row["forward_ms"]), float(row["backward_ms"])

        def predict(overrides=overrides, fwd=measured_fwd, bwd=measured_bwd) -> Prediction:
            prediction = price_one_layer(overrides)
            prediction.extra.update(fwd_meas=fwd, bwd_meas=bwd)
            return prediction

        cases.append(Case("korthikanti_table4", row["experiment"], float(row["combined_ms"]), predict, quick=True))
    return cases


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
        # collective with its GEMM (mpsim prices Transformer Engine's default userbuffers methods;
        # the recipe's tuned ub_cfgs are not printed in the results)
        "training.tp_comm_overlap=true",
        "training.grad_reduce_bucket_bytes=75 MiB",  # optim.bucket_cap_mb: 75
        # overlap_p2p_comm: true, batch_p2p_comm: false: pipeline sends and receives overlap the
        # interleaved schedule's compute
        "training.pp_send_blocking=false",
    ), ("defer-emb-wgrad",)),
    "Nemotron-4 15B": Recipe("nemotron4-15b", (
        "parallel.sequence_parallel=true",  # configure.sh model.sequence_parallel=True
        "training.grad_reduce_bucket_bytes=100 MiB",  # optim.bucket_cap_mb: 100
        "training.pp_send_blocking=true",  # overlap_p2p_comm: False (and PP 1)
        "model.ffn_type=squared_relu",  # Nemotron-4's FFN activation (its model card)
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


def _number(text: str) -> int:
    """An integer the CSV prints as '4.0' or '4'."""
    return int(float(text))


def dgxc_table(data: Path) -> list[Case]:
    rows = read_csv(data / "nvidia_dgxc_benchmarks_v24.11_dense.csv")
    smallest: dict[tuple[str, str], int] = {}
    for row in rows:
        key = (row["model"], row["precision"])
        smallest[key] = min(smallest.get(key, 1 << 30), _number(row["num_gpus"]))
    cases = []
    for row in rows:
        recipe = DGXC_RECIPES[row["model"]]
        precision, precision_gaps = DGXC_PRECISION[row["precision"]]
        gpus, tp, pp, cp = (_number(row[k]) for k in ("num_gpus", "tp", "pp", "cp"))
        vpp = _number(row["virtual_stages"]) if row["virtual_stages"].strip() else 1
        if gpus % 8:
            raise ValueError(f"{row['model']}: {gpus} GPUs is not a whole number of DGX H100 nodes")
        overrides = [
            f"model={recipe.model}",
            f"model.seq_length={_number(row['seq_len'])}", f"model.num_layers={_number(row['layers'])}",
            f"cluster.nodes={gpus // 8}",
            f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.cp={cp}", f"parallel.vpp={vpp}",
            f"parallel.dp={_number(row['dp_as_stated'])}",  # checked against GPUs / (TP x PP x CP)
            f"parallel.schedule={'interleaved-1f1b' if vpp > 1 else '1f1b'}",  # Megatron's schedules
            f"parallel.microbatch_size={_number(row['microbatch'])}",
            f"parallel.global_batch_size={_number(row['global_batch'])}",
            *DGXC_FRAMEWORK, *recipe.overrides, *precision,
        ]
        notes = (*recipe.gaps, *precision_gaps)

        def predict(overrides=overrides) -> Prediction:
            summary = simulate_step(DGXC_BASE, overrides)
            return Prediction(summary.step_time_s, step_breakdown(summary))

        label = f"{row['model']} {row['precision']} {gpus} GPUs"
        cases.append(Case("dgxc_v24.11", label, float(row["step_time_s"]), predict, notes,
                          quick=gpus == smallest[(row["model"], row["precision"])]))
    return cases


# --- Qi et al. 2024, Zero Bubble Pipeline Parallelism: Table 4 on A100 --------------------------------------------
# The authors' fork of Megatron-LM (github.com/sail-sg/zero-bubble-pipeline-parallelism at the
# paper's commit 4769e08): its examples/pretrain_zero_bubble.sh and the defaults of its
# megatron/arguments.py. Model shapes (layers, heads, hidden, FFN, sequence), TP, PP, DP,
# microbatch and microbatch count come from the CSV (the paper's Table 3).
ZB_BASE = SCENARIOS / "published" / "zero_bubble_a100.yaml"
ZB_MODEL = {
    "ffn_type": "gelu",  # Megatron GPT's MLP (GeLU)
    "norm": "layernorm",  # Megatron GPT's LayerNorm
    "position_embedding": "learned",  # --position-embedding-type default learned_absolute
    "tied_embeddings": True,  # --untie-embeddings-and-output-weights not passed
    "linear_bias": True,  # --disable-bias-linear not passed
    "dropout": 0.1,  # --attention-dropout and --hidden-dropout default 0.1
    # Not printed. The script's GPTSentencePieceTokenizer uses a tokenizer.model from the
    # authors' sample dataset; the Table 3 model sizes (rounded to 0.1B) put vocabulary +
    # positions between about 26K and 34K tokens: 32,000, the LLaMA SentencePiece vocabulary
    "vocab_size": 32000,
}
ZB_ASSUMPTIONS = ("vocabulary 32,000 (not printed; consistent with the Table 3 model sizes)",
                  "fp16 (the fork's example script passes --fp16), unfused attention (no --use-flash-attn)")
ZB_FRAMEWORK = [
    "training.transformer_impl=local",  # the fork's legacy megatron/model (--transformer-impl local)
    "training.dtype=fp16",  # examples/pretrain_zero_bubble.sh: --fp16 unless FP32 is set
    "training.attention=unfused",  # the script passes no --use-flash-attn: Megatron's unfused core attention
    "parallel.recompute=none",  # no --recompute-* flags
    "parallel.sequence_parallel=false",  # TP 1 in every setup
    "training.distributed_optimizer=false",  # no --use-distributed-optimizer (and DP 1)
    "training.overlap_grad_reduce=false",  # --overlap-grad-reduce defaults to off (and DP 1)
    # --fp16 without --accumulate-allreduce-grads-in-fp32 (only --bf16 forces it): the
    # gradients are accumulated in fp16; the optimizer keeps fp32 master weights
    "training.fp32_grad_accumulation=false",
    "training.tp_comm_overlap_backward=true",  # Megatron's default (no TP here)
    "training.pp_scatter_gather=true",  # Megatron's default (no TP here)
]
# paper's name -> (mpsim schedule, chunks per rank: None = one layer per chunk as the paper's
# 1F1B-I runs (--num-layers-per-virtual-pipeline-stage 1), blocking pipeline sends)
ZB_SCHEDULES = {
    # Megatron's non-interleaved 1F1B waits for its batched isend/irecv (p2p_communication),
    # then calls torch.cuda.synchronize() (batch_p2p_sync; the fork's arguments.py turns
    # overlap_p2p_comm off for non-interleaved schedules, so batch_p2p_comm is on)
    "1F1B": ("1f1b", 1, True),
    # the fork's Megatron overlaps the interleaved schedule's p2p (--no-overlap-p2p-communication
    # not passed: overlap_p2p_comm defaults to true)
    "1F1B-I": ("interleaved-1f1b", None, False),
    # the fork's zb_schedules.py waits for a receive only before the pass that uses it, and for
    # its sends at the end of the iteration; --zero-bubble-max-pending-backward p (ZB-1p) or 2p
    # (ZB-2p) is what mpsim's zb-1p / zb-2p limit (mpsim/schedules/zb_search.py)
    "ZB-1p": ("zb-1p", 1, False),
    "ZB-2p": ("zb-2p", 1, False),
}


def zero_bubble_split(layers: int, pp: int, vpp: int) -> list[int]:
    """Layers per model chunk as the fork's --allow-padding-num-layers builds them.

    The layer count is padded up to a multiple of pp, split evenly over the chunks, and
    the padding taken off the last chunk, then the first, and so on
    (``ParallelTransformer.get_offset`` in megatron/model/transformer.py): with 2 padding
    layers the first and the last chunk hold one layer fewer (Table 3's note).
    """
    remainder = layers % pp
    padded = layers - remainder + pp if remainder else layers
    if padded % (pp * vpp):
        raise ValueError(f"{padded} padded layers do not split over {pp} x {vpp} chunks")
    sizes = [padded // (pp * vpp)] * (pp * vpp)
    for index in range(-1, padded - layers - 1):
        sizes[index] -= 1
    return sizes


def zero_bubble_table4(data: Path) -> list[Case]:
    rows = read_csv(data / "zero_bubble_main_tables3_4_5_9.csv")
    # --quick: the smallest setup (fewest GPUs, microbatches and layers), all four schedules
    first = min((_number(r["num_gpus"]), _number(r["num_microbatches"]), _number(r["layers"])) for r in rows)
    cases = []
    for row in rows:
        name, chunks, blocking = ZB_SCHEDULES[row["schedule"]]
        layers, pp, gpus = _number(row["layers"]), _number(row["pp"]), _number(row["num_gpus"])
        microbatch, count = _number(row["microbatch"]), _number(row["num_microbatches"])
        tp, dp = _number(row["tp"]), _number(row["dp"])
        if tp * pp * dp != gpus or gpus % 8:
            raise ValueError(f"{row['model']}: tp x pp x dp = {tp * pp * dp} for {gpus} GPUs")
        remainder = layers % pp
        vpp = chunks or (layers - remainder + pp if remainder else layers) // pp
        model = dict(name=f"zero-bubble-{row['model']}", num_layers=layers, hidden_size=_number(row["hidden"]),
                     ffn_hidden_size=_number(row["ffn_hidden"]), num_attention_heads=_number(row["heads"]),
                     seq_length=_number(row["seq_len"]), **ZB_MODEL)
        overrides = [
            "model=" + yaml.safe_dump(model, default_flow_style=True, width=1 << 20).strip(),
            f"cluster.nodes={gpus // 8}",
            f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}", f"parallel.vpp={vpp}",
            f"parallel.schedule={name}",
            f"parallel.microbatch_size={microbatch}", f"parallel.global_batch_size={microbatch * count * dp}",
            f"parallel.layers_per_stage={zero_bubble_split(layers, pp, vpp)}",
            f"training.pp_send_blocking={str(blocking).lower()}",
            # the blocking batched p2p is the one followed by torch.cuda.synchronize()
            f"training.host_sync_between_passes={str(blocking).lower()}",
            *ZB_FRAMEWORK,
        ]

        def predict(overrides=overrides, samples=microbatch * count * dp, gpus=gpus,
                    memory_gb=float(row["memory_gb"])) -> Prediction:
            summary = simulate_step(ZB_BASE, overrides)
            # the table's memory column beside mpsim's peak (GB as the paper prints them, 1e9 bytes:
            # an assumption, the unit is not defined there); not part of the throughput statistics
            return Prediction(samples / summary.step_time_s / gpus, step_breakdown(summary),
                              {"step_s": summary.step_time_s, "mem_meas": memory_gb,
                               "mem_pred": summary.peak_memory_bytes / 1e9})

        label = f"{row['model']} p={pp} m={count} {row['schedule']}"
        notes = ("zb-ilp", "post-validation") if name in ("zb-1p", "zb-2p") else ()
        cases.append(Case("zero_bubble_table4", label, float(row["samples_per_s_per_gpu"]), predict, notes,
                          quick=(gpus, count, layers) == first))
    return cases


# Table 9 of the same paper: the fork's profiled time of one pipeline stage's forward (T_F),
# input-gradient backward (T_B) and weight-gradient backward (T_W) per microbatch, the inputs
# of its Table 5 bubble rates. The fork times each pass with Megatron's Timer, which calls
# torch.cuda.synchronize() and time.time() at its start and stop (megatron/timers.py), in
# iterations 100-110, on every rank, and takes the median over the ranks
# (megatron/core/pipeline_parallel/zb_schedules.py, ScheduleTimers and update_schedule): a
# pass starts on an idle GPU and ends when its last kernel has, so host time the GPU waits
# for is inside it. The median rank is a middle stage (the padded split gives the first and
# last stage one layer fewer). The unit is not printed; milliseconds match Table 4 (1.5B,
# 1F1B, m=24: 24 x (T_F + T_B + T_W) = 1.10 s of a 1.53 s measured step).
ZB_T9_ASSUMPTIONS = ("milliseconds (the unit is not printed; consistent with Table 4's throughput)",
                     "a middle stage: the most layers, no embedding, no LM head (the fork reports the median "
                     "over the stages)",
                     "each pass timed between two torch.cuda.synchronize() calls: host time the GPU waits for "
                     "is inside the measurement; mpsim prices the GPU's kernels")


def price_stage_passes(overrides: list[str], layers: int) -> Prediction:
    """F, B (input gradient) and W (weight gradient) of one middle stage, in ms."""
    work, model = middle_stage(ZB_BASE, overrides, layers)
    ms = 1e3
    forward, backward, weight = (model.price(p).duration_s * ms
                                 for p in (work.forward, work.backward_input, work.backward_weight))
    total = forward + backward + weight
    return Prediction(total, {"compute": total}, {"f_pred": forward, "b_pred": backward, "w_pred": weight})


def zero_bubble_table9(data: Path) -> list[Case]:
    rows = [r for r in read_csv(data / "zero_bubble_main_tables3_4_5_9.csv") if r["schedule"] == "1F1B"]
    # --quick: each model once (its fewest microbatches; the passes do not depend on the count)
    fewest = {}
    for row in rows:
        fewest[row["model"]] = min(fewest.get(row["model"], 1 << 30), _number(row["num_microbatches"]))
    cases = []
    for row in rows:
        layers, pp = _number(row["layers"]), _number(row["pp"])
        microbatch, count = _number(row["microbatch"]), _number(row["num_microbatches"])
        model = dict(name=f"zero-bubble-{row['model']}", num_layers=layers, hidden_size=_number(row["hidden"]),
                     ffn_hidden_size=_number(row["ffn_hidden"]), num_attention_heads=_number(row["heads"]),
                     seq_length=_number(row["seq_len"]), **ZB_MODEL)
        split = zero_bubble_split(layers, pp, 1)
        overrides = [
            "model=" + yaml.safe_dump(model, default_flow_style=True, width=1 << 20).strip(),
            f"cluster.nodes={pp // 8}", f"parallel.tp={_number(row['tp'])}", f"parallel.pp={pp}", "parallel.dp=1",
            "parallel.schedule=1f1b", f"parallel.microbatch_size={microbatch}",
            f"parallel.global_batch_size={microbatch * count}", f"parallel.layers_per_stage={split}",
            # the pass timers call torch.cuda.synchronize() before and after each pass
            "training.host_sync_between_passes=true",
            *ZB_FRAMEWORK,
        ]
        measured = {key: float(row[column]) for key, column in (("f_meas", "TF"), ("b_meas", "TB"), ("w_meas", "TW"))}

        def predict(overrides=overrides, layers=max(split), measured=measured) -> Prediction:
            prediction = price_stage_passes(overrides, layers)
            prediction.extra.update(measured)
            return prediction

        cases.append(Case("zero_bubble_table9", f"{row['model']} p={pp} m={count} ({max(split)} layers)",
                          sum(measured.values()), predict, quick=count == fewest[row["model"]]))
    return cases


TABLES: dict[str, Table] = {
    "korthikanti_table5": Table("Korthikanti et al. 2022, Table 5: iteration time, Megatron-LM (2022) on DGX A100",
                                "step time", "s", "s", korthikanti_table5),
    "korthikanti_table4": Table("Korthikanti et al. 2022, Table 4: one 22B layer, forward + backward, TP 8, "
                                "microbatch 4, A100", "layer forward + backward", "ms", "ms", korthikanti_table4,
                                (("fwd meas", "fwd_meas"), ("fwd pred", "fwd_pred"), ("bwd meas", "bwd_meas"),
                                 ("bwd pred", "bwd_pred"))),
    "dgxc_v24.11": Table("NVIDIA DGX Cloud benchmarking recipes v24.11.1: step time, NeMo 24.09/24.11 on DGX H100",
                         "step time", "s", "s", dgxc_table),
    "zero_bubble_table4": Table("Qi et al. 2024 (Zero Bubble), Table 4: throughput, the authors' Megatron-LM fork "
                                "on A100", "samples/s per GPU", "samples/s/GPU", "s", zero_bubble_table4,
                                (("step s", "step_s"), ("GB meas", "mem_meas"), ("GB pred", "mem_pred")),
                                ZB_ASSUMPTIONS),
    "zero_bubble_table9": Table("Qi et al. 2024 (Zero Bubble), Table 9: profiled F, B and W passes of one "
                                "pipeline stage per microbatch, the authors' fork on A100", "T_F + T_B + T_W",
                                "ms", "ms", zero_bubble_table9,
                                (("F meas", "f_meas"), ("F pred", "f_pred"), ("B meas", "b_meas"),
                                 ("B pred", "b_pred"), ("W meas", "w_meas"), ("W pred", "w_pred")),
                                ZB_ASSUMPTIONS[1:] + ZB_T9_ASSUMPTIONS),
}


# --- running and printing -----------------------------------------------------------------------------------------

def run_case(case: Case) -> Result:
    try:
        prediction = case.predict()
    except Exception as exc:  # noqa: BLE001 - a row mpsim cannot run is reported, not fatal
        return Result(case.table, case.label, case.measured, None, None, {}, {}, case.notes,
                      f"{type(exc).__name__}: {exc}")
    error = 100 * (prediction.value - case.measured) / case.measured
    return Result(case.table, case.label, case.measured, prediction.value, error, prediction.breakdown,
                  prediction.extra, case.notes)


def run(tables: list[str], quick: bool = False, data: Path = DATA, progress: bool = True) -> list[Result]:
    """Predict the rows of ``tables`` (the --quick subset with ``quick``)."""
    cases = [case for name in tables for case in TABLES[name].build(data) if case.quick or not quick]
    results = []
    for index, case in enumerate(cases, 1):
        start = time.perf_counter()
        results.append(run_case(case))
        if progress:
            print(f"[{index}/{len(cases)}] {case.table}: {case.label} ({time.perf_counter() - start:.1f} s)",
                  file=sys.stderr, flush=True)
    return results


def error_statistics(errors: list[float]) -> dict[str, float]:
    """rows, mean and max absolute error and mean signed error (percent)."""
    if not errors:
        return {"rows": 0, "mean_abs_error_pct": float("nan"), "max_abs_error_pct": float("nan"),
                "mean_signed_error_pct": float("nan")}
    return {"rows": len(errors), "mean_abs_error_pct": sum(abs(e) for e in errors) / len(errors),
            "max_abs_error_pct": max(abs(e) for e in errors),
            "mean_signed_error_pct": sum(errors) / len(errors)}


def statistics(results: list[Result]) -> dict[str, float]:
    """The error statistics of the predicted rows."""
    return error_statistics([r.error_pct for r in results if r.error_pct is not None])


def memory_statistics(results: list[Result]) -> dict[str, float] | None:
    """Error statistics of the peak memory, for rows whose source prints it (``mem_meas`` / ``mem_pred``)."""
    pairs = [(r.extra["mem_meas"], r.extra["mem_pred"]) for r in results
             if r.failure is None and "mem_meas" in r.extra and "mem_pred" in r.extra]
    if not pairs:
        return None
    return error_statistics([100.0 * (predicted / measured - 1.0) for measured, predicted in pairs])


def _stats_text(stats: dict[str, float]) -> str:
    return (f"rows={stats['rows']} mean_abs_error_pct={stats['mean_abs_error_pct']:.2f} "
            f"max_abs_error_pct={stats['max_abs_error_pct']:.2f} "
            f"mean_signed_error_pct={stats['mean_signed_error_pct']:.2f}")


def _fmt(value: float | None, width: int) -> str:
    if value is None:
        return f"{'-':>{width}s}"
    digits = 3 if abs(value) < 100 else 1
    return f"{value:{width}.{digits}f}"


def print_table(name: str, results: list[Result]) -> None:
    table = TABLES[name]
    print(f"== {name}: {table.title}")
    print(f"   measured / predicted: {table.quantity} ({table.unit}); breakdown in {table.breakdown_unit} of the "
          f"predicted {PREDICTED_UNIT.get(name, 'step')}")
    for assumption in table.assumptions:
        print(f"   assumed: {assumption}")
    width = max([len(r.label) for r in results] + [13])
    extra = table.extra_columns
    header = (f"{'configuration':{width}s} {'measured':>9s} {'predicted':>9s} {'error':>7s} "
              + " ".join(f"{h:>8s}" for h in ("compute", "bubble", "TP", "CP", "PP", "DP", "optim"))
              + "".join(f" {h:>8s}" for h, _ in extra) + "  note")
    print(header)
    for r in results:
        if r.failure is not None:
            print(f"{r.label:{width}s} {_fmt(r.measured, 9)} {'failed':>9s}  {r.failure}")
            continue
        cells = " ".join(_fmt(r.breakdown.get(key), 8) for key in BREAKDOWN)
        more = "".join(f" {_fmt(r.extra.get(key), 8)}" for _, key in extra)
        note = ",".join(r.notes)
        print(f"{r.label:{width}s} {_fmt(r.measured, 9)} {_fmt(r.predicted, 9)} {r.error_pct:+6.1f}% {cells}{more}"
              f"  {note}".rstrip())
    print(f"{name}: {_stats_text(statistics(results))}")
    memory = memory_statistics(results)
    if memory is not None:
        print(f"{name} peak memory (GB measured against mpsim's peak_memory_bytes; not in the line above or the "
              f"last line): {_stats_text(memory)}")
    print()


def print_gaps(names: list[str], results: list[Result]) -> None:
    print("not expressible yet (the rows use the nearest setting; the note column names the gap):")
    used = sorted({note for r in results for note in r.notes if note in GAPS}, key=list(GAPS).index)
    for key in used:
        counts = ", ".join(f"{name}: {sum(key in r.notes for r in results if r.table == name)} rows"
                           for name in names if any(key in r.notes for r in results if r.table == name))
        print(f"  {key} ({counts}): {GAPS[key]}")
    for name in names:
        for scope, text in TABLE_GAPS.get(name, []):
            print(f"  {name}, {scope}: {text}")
    if not used and not any(TABLE_GAPS.get(name) for name in names):
        print("  none")
    failed = [r for r in results if r.failure is not None]
    if failed:
        print(f"rows mpsim could not run ({len(failed)}; left out of the statistics):")
        for r in failed:
            print(f"  {r.table}: {r.label}: {r.failure}")


def report(names: list[str], results: list[Result]) -> dict:
    """Print the tables, the gaps and the summary lines; return the same as a JSON-ready dict."""
    per_table = {}
    for name in names:
        rows = [r for r in results if r.table == name]
        if rows:
            print_table(name, rows)
            per_table[name] = statistics(rows)
            memory = memory_statistics(rows)
            if memory is not None:
                per_table[name]["peak_memory"] = memory
    print_gaps(names, results)
    overall = statistics(results)
    print(f"tables={len(per_table)} rows={overall['rows']} mean_abs_error_pct={overall['mean_abs_error_pct']:.2f} "
          f"max_abs_error_pct={overall['max_abs_error_pct']:.2f} "
          f"mean_signed_error_pct={overall['mean_signed_error_pct']:.2f}")
    return {"tables": per_table, "overall": overall, "rows": [asdict(r) for r in results],
            "gaps": {key: GAPS[key] for key in GAPS if any(key in r.notes for r in results)},
            "table_gaps": {name: TABLE_GAPS.get(name, []) for name in per_table}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="append", choices=list(TABLES), metavar="NAME",
                        help=f"run only this table (repeatable): {', '.join(TABLES)}")
    parser.add_argument("--quick", action="store_true", help="a few rows per table (for CI)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows and statistics as JSON")
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the published CSV files")
    args = parser.parse_args(argv)
    names = [name for name in TABLES if args.table is None or name in args.table]
    start = time.perf_counter()
    results = run(names, quick=args.quick, data=args.data)
    out = report(names, results)
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
