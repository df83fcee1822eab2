"""The unfused attention path's kernels: what Megatron's CoreAttention runs besides its two batched GEMMs."""

from __future__ import annotations

from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import compute_ops
from tests.conftest import SCENARIOS

GPT = SCENARIOS / "megatron_22b_8xa100.yaml"  # Korthikanti et al.'s 22B layer: unfused attention, TP 8


def first_layer_forward(*overrides: str) -> tuple:
    scenario = load_scenario(GPT, list(overrides)).scenario
    layout = resolve(scenario)
    stage = build_workload(scenario, layout).stages[0]
    label = next(block.label for block in stage.forward if block.label.startswith("layer"))
    ops = [op for block in stage.forward if block.label == label for op in compute_ops(block.items)]
    return scenario, layout, [op.name for op in ops], {op.name: op for op in ops}


def test_the_context_is_copied_back_to_token_order_after_the_second_gemm():
    # Megatron: context_layer.permute(2, 0, 1, 3).contiguous() before the output projection
    scenario, layout, names, ops = first_layer_forward("training.attention=unfused")
    assert names.index("attn.context") + 1 == names.index("attn.context.to_tokens") < names.index("attn.proj")
    model = scenario.model
    elements = layout.microbatch_size * model.seq_length * model.hidden_size // layout.tp
    assert ops["attn.context.to_tokens"].bytes == 2 * elements * 2  # read and written, 2-byte activations


def test_fused_attention_writes_its_output_in_token_order():
    _, _, names, _ = first_layer_forward("training.attention=flash")
    assert "attn.context.to_tokens" not in names
