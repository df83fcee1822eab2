"""What deferred weight-gradient passes hold: the memory table's "held for W" and its JSON field."""

from __future__ import annotations

import json
import re

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
    # PP 1, one microbatch: F, I, W. After F the rank holds the activations, after I what W needs.
    result, memory = memory_of(MEGATRON22, "parallel.schedule=zb-h1")
    work = result.workload.stages[0]
    [m] = memory
    assert work.weight_grad_buffer_bytes > work.activation_bytes  # the output gradients come on top of the inputs
    assert m.peak_in_flight == 0
    assert m.activations_peak_bytes == work.weight_grad_buffer_bytes
    assert m.weight_grad_held_bytes == work.weight_grad_buffer_bytes


def test_schedules_without_a_split_backward_hold_nothing_for_w():
    _, memory = memory_of(LLAMA70)
    assert all(m.weight_grad_held_bytes == 0 for m in memory)


def test_held_for_w_is_part_of_the_activations_peak():
    result, memory = memory_of(LLAMA70, "parallel.schedule=zb-h1")
    for m in memory:
        assert 0 < m.weight_grad_held_bytes <= m.activations_peak_bytes
        # whole microbatches' worth of the rank's one stage
        [stage] = m.stages
        buffer = result.workload.stages[stage].weight_grad_buffer_bytes
        assert abs(m.weight_grad_held_bytes / buffer - round(m.weight_grad_held_bytes / buffer)) < 1e-9


def test_table_and_json_show_held_for_w(capsys):
    assert main(["run", str(MEGATRON22), "--set", "parallel.schedule=zb-h1"]) == 0
    table = capsys.readouterr().out
    assert "held for W" in table
    assert main(["run", str(MEGATRON22), "--set", "parallel.schedule=zb-h1", "--json"]) == 0
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
