"""cuDNN Frontend's Llama 3.2 1B training loop on one H200 and one B200: an out-of-sample check.

``python benchmarks/validate_published.py --out-of-sample`` (or ``--table cudnn_llama1b``)
adds the iteration times NVIDIA's cuDNN Frontend repository publishes for its
``benchmark/Llama-3.2-1B-Training`` (commit 0b1577c, October 2025; rows in
``benchmarks/data/cudnn_llama32_1b_training.csv``): Hugging Face's LlamaForCausalLM for
Llama 3.2 1B, in bf16, trained on one GPU in eager mode at 12,288 to 18,432 tokens per
iteration, from 24 sequences of 768 tokens to one of 16,384, with PyTorch's
scaled_dot_product_attention held to one backend per run (``training_perf.py``: the mean of
100 iterations after 5 of warm-up; PyTorch 2.7, CUDA 12.9, cuDNN 9.9 in NGC's 25.04 container).
One GPU and no framework around the model: the rows check the kernels and PyTorch's
eager operators of a whole training step, with nothing to overlap. Llama 3.2 1B's heads are
of 64, where every attention sweep the H200 and B200 files carry measured heads of 128.

Backends, as mpsim names the kernel (``training.attention_kernel``): CUDNN_ATTENTION on the
H200 is the file's default cuDNN sweep (cuDNN's own table of the same kernel on an H200), on
the B200 ``sdpa-cudnn`` (cuDNN through PyTorch's SDPA, the path this benchmark takes);
FLASH_ATTENTION on the B200 is ``flash-attention-2`` (the flash-attn rows of the same B200
table), on the H200 ``flash-attention-2`` too (PyTorch's SDPA flash backend measured on an
H200 at 4k and 8k tokens, HOPPER-LOAD, its other lengths and heads of 64 by the H100's
FlashAttention-2 chart on the same chip). Left out: EFFICIENT_ATTENTION (PyTorch's
memory-efficient kernel, which no hardware file measures).
"""

from __future__ import annotations

from pathlib import Path

from published_common import SCENARIOS, Case, number, read_csv, step_prediction

CSV = Path(__file__).resolve().parent / "data" / "cudnn_llama32_1b_training.csv"
BASE = SCENARIOS / "published" / "cudnn_llama32_1b_1gpu.yaml"

# (gpu, backend) -> (mpsim system, training.attention_kernel); absent: not expressible
KERNELS = {("H200", "CUDNN_ATTENTION"): ("hgx-h200", "cudnn"),
           ("B200", "CUDNN_ATTENTION"): ("hgx-b200", "sdpa-cudnn"),
           ("B200", "FLASH_ATTENTION"): ("hgx-b200", "flash-attention-2"),
           ("H200", "FLASH_ATTENTION"): ("hgx-h200", "flash-attention-2")}

ASSUMPTIONS = (
    "one GPU of an HGX board (cluster.num_devices 1); the repository does not say whether the "
    "clock was locked (its README recommends it): priced at the clock under load, as every row of this "
    "harness",
    "torch.optim.SGD without momentum (read the parameter and its gradient, write the parameter) priced as "
    "Adam with bf16 state (adam-bf16, mpsim's nearest: 8 bytes a parameter more to stream, about 2 ms of "
    "an H200's and 1.3 ms of a B200's 130-430 ms iteration)",
    "the model's input is given as embeddings (inputs_embeds): mpsim still prices the embedding lookup "
    "and its dense gradient (a few hundred microseconds)",
)
LEFT_OUT = ("6 rows", "left out: EFFICIENT_ATTENTION (PyTorch's memory-efficient SDPA kernel, measured in no "
                      "hardware file) on both GPUs")


def cudnn_llama_table(_data: Path) -> list[Case]:
    cases = []
    for row in read_csv(CSV):
        kernel = KERNELS.get((row["gpu"], row["backend"]))
        if kernel is None:
            continue
        system, attention_kernel = kernel
        batch, seq = number(row["batch_size"]), number(row["seq_len"])
        overrides = [
            f"cluster.system={system}",
            f"training.attention_kernel={attention_kernel}",
            f"model.seq_length={seq}",
            # one batch per iteration, no gradient accumulation
            f"parallel.microbatch_size={batch}", f"parallel.global_batch_size={batch}",
        ]

        label = f"{row['gpu']} {attention_kernel} {batch} x {seq}"
        cases.append(Case("cudnn_llama1b", label, float(row["iteration_s"]), step_prediction(BASE, overrides),
                          quick=seq == 2048))
    return cases
