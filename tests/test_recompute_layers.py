"""Megatron's block recompute: only the first N layers of each chunk recompute (parallel.recompute_num_layers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"


def first_stage(*overrides: str):
    s = load_scenario(LLAMA70, list(overrides)).scenario
    return build_workload(s, resolve(s)).stages[0], s


def recomputed(work) -> list[str]:
    return [block.label for block in work.backward if block.category == "recompute"]


def test_the_first_n_layers_of_each_chunk_recompute_and_keep_only_their_input():
    none, _ = first_stage("parallel.recompute=none")
    full, _ = first_stage("parallel.recompute=full")
    part, _ = first_stage("parallel.recompute=full", "parallel.recompute_num_layers=2")
    layers = [block.label for block in full.forward if block.label.startswith("layer")]
    assert len(layers) > 2
    assert sorted(recomputed(part)) == sorted(layers[:2])
    assert len(recomputed(full)) == len(layers) and recomputed(none) == []
    per_layer_none = none.layer_activation_bytes / len(layers)
    per_layer_full = full.layer_activation_bytes / len(layers)
    assert per_layer_full < per_layer_none
    assert part.layer_activation_bytes == pytest.approx(2 * per_layer_full + (len(layers) - 2) * per_layer_none)


def test_more_layers_recomputed_is_slower_and_as_many_as_the_chunk_is_full_recompute():
    steps = {n: summarize(simulate(load_scenario(LLAMA70, ["parallel.recompute=full",
                                                            f"parallel.recompute_num_layers={n}"]).scenario)).step_time_s
             for n in (1, 3)}
    none = summarize(simulate(load_scenario(LLAMA70, ["parallel.recompute=none"]).scenario)).step_time_s
    full = summarize(simulate(load_scenario(LLAMA70, ["parallel.recompute=full"]).scenario)).step_time_s
    layers = max(resolve(load_scenario(LLAMA70, []).scenario).layers_per_chunk)
    everything = summarize(simulate(load_scenario(LLAMA70, ["parallel.recompute=full",
                                                             f"parallel.recompute_num_layers={layers}"]).scenario))
    assert none < steps[1] < steps[3] <= full
    assert everything.step_time_s == pytest.approx(full)


def test_recompute_num_layers_without_full_recompute_is_one_line():
    result = subprocess.run([sys.executable, "-m", "mpsim", "run", str(LLAMA70), "--set",
                             "parallel.recompute_num_layers=2"], capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "parallel.recompute_num_layers" in lines[0] and "full" in lines[0]
