"""torchtitan's published FSDP2 runs, an out-of-sample check for ``benchmarks/validate_published.py``.

``python benchmarks/validate_published.py --out-of-sample`` (or ``--table torchtitan_a100``)
adds the throughputs torchtitan's performance page printed for Llama 2 and Llama 3 trained
with FSDP2 alone on 64 A100 80GB (``docs/performance.md`` at commit 157a12c, April 2024; rows
in ``benchmarks/data/torchtitan_performance.csv``): tokens per second per GPU, turned into a
step time (local batch x sequence / tokens per second per GPU). These are the only published
runs here that train with FSDP and plain PyTorch modules, so they check a path none of the
other tables takes: ZeRO-3's per-layer gathers and scatters, autograd's gradient adds, the
eager operators of an un-compiled model. The framework settings come from the
``train_configs`` of the same commit (``scenarios/published/torchtitan_a100.yaml`` names
each); what the page leaves out is listed in the assumptions.

torchtitan's ``layer`` policy of selective activation checkpointing recomputes every second
block whole (``selective_ac_option`` 2, the page does not print the number): priced as that
many blocks fully recomputed (``parallel.recompute_num_layers``, half the layers; with one
chunk per rank only the count matters). Its ``op`` policy, which keeps the outputs of every
other matmul and of attention and recomputes the rest, is ``parallel.recompute:
selective-op`` (``mpsim/workload/op_recompute.py``; its three rows were left out until it
was). The later page (H100 rows, January
2025) ran on Grand Teton H100s with 96 GB of HBM2e at a 500 W limit, whose peak its authors
say they do not know; no hardware file here describes that part.
"""

from __future__ import annotations

from pathlib import Path

from published_common import SCENARIOS, Case, number, read_csv, step_prediction
from published_nemo import LLAMA2

from mpsim.specs import load_scenario

CSV = Path(__file__).resolve().parent / "data" / "torchtitan_performance.csv"
TORCHTITAN_BASE = SCENARIOS / "published" / "torchtitan_a100.yaml"

# the page's models: Llama 3 as shipped; Llama 2 as the NeMo rows write it (Touvron et al. 2023)
MODELS = {"Llama 3 8B": ("llama3-8b", ()), "Llama 3 70B": ("llama3-70b", ()),
          "Llama 2 13B": LLAMA2["LLAMA2-13B"], "Llama 2 70B": LLAMA2["LLAMA2-70B"]}
# the page's activation checkpointing -> (mpsim's recompute, share of the layers recomputed)
RECOMPUTE = {"none": ("none", 1), "full": ("full", 1), "selective op": ("selective-op", 1),
             "selective layer": ("full", 2)}
# train_configs' norm_type: rmsnorm is torchtitan's RMSNorm module (PyTorch operators, eager);
# fused_rmsnorm its Triton kernel, one each way (torchtitan/models/norms.py)
NORM_KERNEL = {"rmsnorm": "operators", "fused_rmsnorm": "fused"}

ASSUMPTIONS = (
    "the network: the page names 64 A100 (80GB) only; nearest: the shipped dgx-a100 system "
    "(8 nodes, 8x HDR 200 Gb/s InfiniBand each)",
    "the norm of each model as its train_config at the same commit sets it (norm_type), the other "
    "settings from those configs and torchtitan's parallelize_llama.py: FSDP2 on every block, bf16 "
    "parameters, fp32 gradient reduction, no torch.compile, gradient clipping at 1.0",
    "selective layer checkpointing every second block (the page does not print the frequency): half the "
    "layers fully recomputed",
)


def torchtitan_table(_data: Path) -> list[Case]:
    cases = []
    for row in read_csv(CSV):
        gpus, batch, seq = (number(row[k]) for k in ("num_gpus", "local_batch", "seq_len"))
        model, settings = MODELS[row["model"]]
        recompute, every = RECOMPUTE[row["activation_checkpointing"]]
        overrides = [
            f"model={model}", *settings, f"model.seq_length={seq}",
            f"cluster.nodes={gpus // 8}", f"parallel.dp={gpus}",
            # one microbatch of the local batch per step (no gradient accumulation in the configs)
            f"parallel.microbatch_size={batch}", f"parallel.global_batch_size={batch * gpus}",
            f"parallel.recompute={recompute}",
            f"training.norm_kernel={NORM_KERNEL[row['norm_type']]}",
        ]
        if every > 1:  # every ``every``-th block of the model's (one chunk per rank: only the count matters)
            layers = load_scenario(TORCHTITAN_BASE, overrides).scenario.model.num_layers
            overrides.append(f"parallel.recompute_num_layers={layers // every}")
        step_s = batch * seq / float(row["wps_per_gpu"])

        label = f"{row['model']} batch {batch} AC {row['activation_checkpointing']}"
        cases.append(Case("torchtitan_a100", label, step_s, step_prediction(TORCHTITAN_BASE, overrides),
                          quick=row["model"] == "Llama 2 13B"))
    return cases
