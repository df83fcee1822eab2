"""What deferred weight-gradient passes hold: the memory table's "held for W" and its JSON field."""

from __future__ import annotations

import json
import re

import pytest

from mpsim.cli import main
from mpsim.results.memory import rank_memory
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import ROOT, SCENARIOS

MEGATRON22 = SCENARIOS / "megatron_22b_8xa100.yaml"
LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"


def memory_of(path, *overrides):
    loaded = load_scenario(path, list(overrides))
    result = simulate(loaded.scenario, loaded.path.parent)
    return result, rank_memory(result.scenario, result.layout, result.schedule, result.workload)


def test_one_microbatch_of_zb_h1_peaks_on_what_its_w_holds():
    # PP 1, one microbatch: F, I, W. After F the rank holds the activations, after I what W
    # needs. Under full recompute F keeps only each layer's input, while W needs every GEMM's
    # input and output gradient: the peak is what W holds.
    result, memory = memory_of(MEGATRON22, "parallel.schedule=zb-h1", "parallel.recompute=full")
    work = result.workload.stages[0]
    [m] = memory
    assert work.weight_grad_buffer_bytes > work.activation_bytes
    assert m.peak_in_flight == 0
    assert m.activations_peak_bytes == work.weight_grad_buffer_bytes
    assert m.weight_grad_held_bytes == work.weight_grad_buffer_bytes


def test_under_sequence_parallelism_w_keeps_the_sharded_tensors():
    # Megatron 22B runs TP 8 with sequence parallelism. The Zero Bubble fork keeps what arrives
    # sharded (a column-parallel GEMM's input, a row-parallel GEMM's output gradient) and
    # gathers it again for the weight pass, so W holds less than F, the peak is after F (the
    # paper's ZB-H1 keeps 1F1B's peak), and the weight pass carries the all-gathers
    sharded, memory = memory_of(MEGATRON22, "parallel.schedule=zb-h1")
    whole, _ = memory_of(MEGATRON22, "parallel.schedule=zb-h1", "parallel.sequence_parallel=false")
    work, [m] = sharded.workload.stages[0], memory
    assert work.weight_grad_buffer_bytes < work.activation_bytes
    assert m.activations_peak_bytes == work.activation_bytes and m.weight_grad_held_bytes == 0
    layer_w = [op for block in work.backward_weight for op in block.items if getattr(op, "kind", "") == "collective"]
    regathers = {op.name.rsplit(".", 2)[-2] + "." + op.name.rsplit(".", 1)[-1] for op in layer_w}
    assert {"proj.regather_grad", "fc2.regather_grad", "qkv.regather_input", "fc1.regather_input"} <= regathers
    assert not [op for block in whole.workload.stages[0].backward_weight for op in block.items
                if getattr(op, "kind", "") == "collective"]


def test_schedules_without_a_split_backward_hold_nothing_for_w():
    _, memory = memory_of(LLAMA70)
    assert all(m.weight_grad_held_bytes == 0 for m in memory)


def test_held_for_w_is_part_of_the_activations_peak():
    result, memory = memory_of(LLAMA70, "parallel.schedule=zb-h1")
    _, one_f_one_b = memory_of(LLAMA70)
    # the first rank runs each W right after its I; the later ranks defer some
    assert memory[0].weight_grad_held_bytes == 0 and memory[-1].weight_grad_held_bytes > 0
    pp = len(memory)
    for m in memory:
        assert 0 <= m.weight_grad_held_bytes <= m.activations_peak_bytes
        # ZB-H1 keeps 1F1B's bound: microbatches in flight and those waiting for their W are
        # never more than the pipeline's depth, each holding the larger of what F and W keep
        [stage] = m.stages
        work = result.workload.stages[stage]
        assert m.activations_peak_bytes <= pp * max(work.activation_bytes, work.weight_grad_buffer_bytes) * (1 + 1e-12)
        # whole microbatches' worth of the rank's one stage
        buffer = work.weight_grad_buffer_bytes
        assert abs(m.weight_grad_held_bytes / buffer - round(m.weight_grad_held_bytes / buffer)) < 1e-9
    # with W holding no more than F under sequence parallelism, the middle ranks peak where the
    # first rank of 1F1B does (the paper's claim for ZB-H1, uniform stages)
    assert memory[1].activations_peak_bytes == pytest.approx(one_f_one_b[0].activations_peak_bytes, rel=1e-12)


def test_table_and_json_show_held_for_w(capsys):
    # full recompute: W holds more than F keeps, so the peak is what W holds
    split = ["--set", "parallel.schedule=zb-h1", "--set", "parallel.recompute=full"]
    assert main(["run", str(MEGATRON22), *split]) == 0
    table = capsys.readouterr().out
    assert "held for W" in table
    assert main(["run", str(MEGATRON22), *split, "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["memory"]
    assert entry["weight_grad_held_bytes"] == entry["activations_peak_bytes"] > 0
    assert main(["run", str(MEGATRON22)]) == 0
    assert "held for W" not in capsys.readouterr().out  # 1F1B: the column would only hold zeros


def test_every_memory_field_of_the_json_is_documented(capsys):
    assert main(["run", str(MEGATRON22), "--json"]) == 0
    fields = set(json.loads(capsys.readouterr().out)["memory"][0])
    text = (ROOT / "docs" / "json.md").read_text()
    section = text[text.index("## `memory[]`"):]
    section = section[:section.index("\n#", 1)]
    documented = {name for row in section.splitlines() if row.startswith("| `")
                  for name in re.findall(r"`(\w+)`", row.split(" | ")[0])}
    assert fields <= documented, f"undocumented in docs/json.md: {sorted(fields - documented)}"
