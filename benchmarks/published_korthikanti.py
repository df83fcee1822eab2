"""Korthikanti et al. 2022's tables for ``benchmarks/validate_published.py``.

"Reducing Activation Recomputation in Large Transformer Models" measured Megatron-LM of
2022 on Selene (DGX A100): Table 5, the iteration time of GPT 22B to 1T with full
recompute and with sequence parallelism + selective recompute (8 rows); Table 4, the
forward and backward time of one 22B layer under five recompute / sequence-parallel
settings (5 rows), priced with the cost model alone as auto balancing prices one layer.
``benchmarks/validate_korthikanti.py`` builds its rows with :func:`korthikanti_overrides`.
"""

from __future__ import annotations

import re
from pathlib import Path

from published_common import SCENARIOS, Case, Prediction, middle_stage, read_csv, step_prediction


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
            cases.append(Case("korthikanti_table5", f"{row['model']} {mode} ({row['num_gpus']} GPUs)",
                              float(row[column]), step_prediction(KORTHIKANTI_BASE, overrides),
                              quick=int(row["num_gpus"]) == smallest))
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
