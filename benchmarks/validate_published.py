"""Predict every published training run in the shared validation data and print the error.

The rows come from the CSV files of ``../shared/validation`` (the shared folder beside the
repository), read at run time: nothing measured is copied into this file. Each row is
written as an mpsim scenario the way its framework ran it (a base scenario file plus
``--set`` overrides, through the public loader), simulated, and summarized. Ten tables:

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
* ``zero_bubble_table6``, ``_table7``, ``_table10``, ``_table11``, ``_table12``: the same
  paper's other throughput tables, on the same four models: ZB-V against ZB-2p, ZB-1p and
  1F1B on 16 to 32 GPUs (36 rows), a microbatch doubled (18), ZB-2p with and without the
  optimizer's post-validation (8), 1F1B and ZB-1p at ZB-2p's memory (30 of 36; six print
  an ambiguous microbatch count and are left out), fewer microbatches than stages (18).

The Zero Bubble tables are built in ``published_zero_bubble.py``; what every table shares
(rows, predictions, pricing a step or a stage) is in ``published_common.py``.

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
microbatches, each Zero Bubble model's Table 9 passes once, the smallest setup's rows of
the other Zero Bubble tables), for CI; ``tests/test_validate_published.py`` guards their errors.

Usage: python benchmarks/validate_published.py [--table NAME ...] [--quick] [--json FILE]
       [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_zero_bubble  # noqa: E402,F401 (its tables' shapes, for the tests)
from published_common import (DATA, SCENARIOS, Case, Prediction, Result, Table, middle_stage,  # noqa: E402
                              number, read_csv, simulate_step, step_breakdown)
from published_zero_bubble import (ZB_ASSUMPTIONS, ZB_MORE_ASSUMPTIONS, ZB_T9_ASSUMPTIONS,  # noqa: E402
                                   ZB_T11_LEFT_OUT, zero_bubble_split, zero_bubble_table4, zero_bubble_table6,
                                   zero_bubble_table7, zero_bubble_table9, zero_bubble_table10, zero_bubble_table11,
                                   zero_bubble_table12)


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
# the cluster of every Zero Bubble throughput table
ZB_CLUSTER_GAP = ("all rows", ("the cluster is 'up to 4 nodes x 8 A100 SXM 80GB, RoCE RDMA' with no NIC bandwidth "
                               "printed; nearest: the shipped dgx-a100 system (8x HDR 200 Gb/s InfiniBand per node)"))
TABLE_GAPS: dict[str, list[tuple[str, str]]] = {
    "zero_bubble_table4": [ZB_CLUSTER_GAP],
    "zero_bubble_table6": [ZB_CLUSTER_GAP],
    "zero_bubble_table7": [ZB_CLUSTER_GAP],
    "zero_bubble_table10": [ZB_CLUSTER_GAP],
    "zero_bubble_table11": [ZB_CLUSTER_GAP, ZB_T11_LEFT_OUT],
    "zero_bubble_table12": [ZB_CLUSTER_GAP],
}

BREAKDOWN = ("compute", "bubble", "tp", "cp", "pp", "dp", "optimizer")
# what a table's breakdown splits, where it is not a step
PREDICTED_UNIT = {"korthikanti_table4": "layer", "zero_bubble_table9": "stage's passes"}


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

        def predict(overrides=overrides) -> Prediction:
            summary = simulate_step(DGXC_BASE, overrides)
            return Prediction(summary.step_time_s, step_breakdown(summary))

        label = f"{row['model']} {row['precision']} {gpus} GPUs"
        cases.append(Case("dgxc_v24.11", label, float(row["step_time_s"]), predict, notes,
                          quick=gpus == smallest[(row["model"], row["precision"])]))
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
    "zero_bubble_table6": Table("Qi et al. 2024 (Zero Bubble), Table 6: ZB-V against ZB-2p (half the microbatch, "
                                "twice the count), ZB-1p and 1F1B, the authors' fork on A100", "samples/s per GPU",
                                "samples/s/GPU", "s", zero_bubble_table6,
                                (("step s", "step_s"), ("GB meas", "mem_meas"), ("GB pred", "mem_pred")),
                                ZB_ASSUMPTIONS + ZB_MORE_ASSUMPTIONS),
    "zero_bubble_table7": Table("Qi et al. 2024 (Zero Bubble), Table 7: ZB-V, ZB-1p and 1F1B at a microbatch and at "
                                "twice it, the authors' fork on A100", "samples/s per GPU", "samples/s/GPU", "s",
                                zero_bubble_table7, (("step s", "step_s"),), ZB_ASSUMPTIONS + ZB_MORE_ASSUMPTIONS),
    "zero_bubble_table10": Table("Qi et al. 2024 (Zero Bubble), Table 10: ZB-2p with the optimizer's post-validation "
                                 "and with its synchronised step, the authors' fork on A100", "samples/s per GPU",
                                 "samples/s/GPU", "s", zero_bubble_table10, (("step s", "step_s"),),
                                 ZB_ASSUMPTIONS + ZB_MORE_ASSUMPTIONS),
    "zero_bubble_table11": Table("Qi et al. 2024 (Zero Bubble), Table 11: 1F1B and ZB-1p at twice ZB-2p's "
                                 "microbatch (the same memory), the authors' fork on A100", "samples/s per GPU",
                                 "samples/s/GPU", "s", zero_bubble_table11,
                                 (("step s", "step_s"), ("GB meas", "mem_meas"), ("GB pred", "mem_pred")),
                                 ZB_ASSUMPTIONS + ZB_MORE_ASSUMPTIONS),
    "zero_bubble_table12": Table("Qi et al. 2024 (Zero Bubble), Table 12: fewer microbatches than stages, 1F1B and "
                                 "ZB-2p, the authors' fork on A100", "samples/s per GPU", "samples/s/GPU", "s",
                                 zero_bubble_table12,
                                 (("step s", "step_s"), ("GB meas", "mem_meas"), ("GB pred", "mem_pred")),
                                 ZB_ASSUMPTIONS + ZB_MORE_ASSUMPTIONS),
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
