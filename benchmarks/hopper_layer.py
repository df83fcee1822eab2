"""One transformer layer priced by mpsim against the same layer timed on an H200.

``benchmarks/hopper_kernels.py`` (part 4) times one Llama 3.1 8B layer (hidden 4,096,
SwiGLU FFN 14,336, GQA 32/8 heads of 128, RMSNorm, RoPE) written as plain PyTorch calls
under autograd, in bf16 on one H200 SXM, forward and forward + backward, at 4,096 and
8,192 tokens, after the GPU has been kept busy (its clock at the power limit); the
readings are in ``benchmarks/data/hopper_kernels_h200.json`` (``layer``). This script
prices one layer of ``scenarios/published/hopper_layer_h200.yaml`` (the same layer, plain
PyTorch modules, fused attention, on ``hgx-h200``) at each reading's sequence length as
a pipeline stage's forward and backward pass, and prints measured, predicted and the
error per reading, and last::

    rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>

Nothing is fitted to these readings: the GEMMs are priced from the H200's MAMF, attention
from a published cuDNN sweep, the rest from the memory bandwidth; the one number shared
with their source is the GEMM clock under load (``efficiency.sustained_compute``), which
the same script's GEMM readings on the same GPU set. It checks a whole layer's kernels
on Hopper without a framework around them (no tensor parallelism, no pipeline, no NeMo).

Usage: python benchmarks/hopper_layer.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_common import middle_stage, print_error_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
READINGS = ROOT / "benchmarks" / "data" / "hopper_kernels_h200.json"
SCENARIO = ROOT / "scenarios" / "published" / "hopper_layer_h200.yaml"


def layer_seconds(seq: int) -> tuple[float, float]:
    """mpsim's forward and forward + backward seconds of one layer at ``seq`` tokens."""
    work, model = middle_stage(SCENARIO, [f"model.seq_length={seq}"], 1)
    forward = model.price(work.forward).duration_s
    return forward, forward + model.price(work.backward).duration_s


def rows() -> list[dict]:
    """One row per reading and pass: measured and predicted seconds."""
    out = []
    for reading in json.loads(READINGS.read_text())["layer"]:
        if "error" in reading:
            continue
        forward, both = layer_seconds(reading["seq"])
        out.append({"label": f"{reading['label']} forward", "measured_s": reading["forward_s"], "predicted_s": forward})
        out.append({"label": f"{reading['label']} forward+backward", "measured_s": reading["forward_backward_s"],
                    "predicted_s": both})
    return out


def main() -> int:
    results = rows()
    if not results:
        print(f"no layer readings in {READINGS}", file=sys.stderr)
        return 2
    print_error_rows("reading", [(row["label"], 1e3 * row["measured_s"], 1e3 * row["predicted_s"])
                                 for row in results], "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
