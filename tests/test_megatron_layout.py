"""Megatron-Core's pipeline layout string as ``parallel.layers_per_stage`` (mpsim/specs/megatron_layout.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpsim.cli import main
from mpsim.errors import InputError
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.layout import resolve_layout
from mpsim.specs.megatron_layout import layers_from_layout
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"
# Megatron-Bridge's Llama 3 70B recipe on 64 H100 at FP8 (src/megatron/bridge/perf_recipes/llama/h100/llama3.py
# at 4ab94df): TP 4, PP 8, VP 5, the last chunk one layer and the loss
BRIDGE_70B = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
INTERLEAVED = ("parallel.pp=8", "parallel.vpp=5", "parallel.tp=4", "cluster.nodes=4", "parallel.global_batch_size=16",
               "parallel.schedule=interleaved-1f1b")


def test_the_recipes_layout_is_its_layer_counts():
    assert layers_from_layout(BRIDGE_70B) == [2] * 35 + [3] + [2] * 3 + [1]
    # Megatron-Core's own example, without its multi-token prediction chunk
    assert layers_from_layout("Ettt|(tt|)*29,L") == [3] + [2] * 29 + [0]


@given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=24))
def test_any_list_written_as_a_layout_reads_back(counts):
    layout = "E" + "|".join("t" * n for n in counts) + "L"
    assert layers_from_layout(layout) == counts
    repeated = "E" + "|".join(f"t*{n}" if n else "" for n in counts) + "L"
    assert layers_from_layout(repeated) == counts


def test_a_layout_runs_as_its_list():
    def step(split: str) -> float:
        loaded = load_scenario(LLAMA70, [*INTERLEAVED, f"parallel.layers_per_stage={split}"])
        return simulate(loaded.scenario).timeline.pipeline_end_s

    as_list = "[" + ",".join(map(str, layers_from_layout(BRIDGE_70B))) + "]"
    assert step(BRIDGE_70B) == step(as_list)
    # the lighter last chunk is not the even split: the layout reaches the simulation
    even = simulate(load_scenario(LLAMA70, list(INTERLEAVED)).scenario).timeline.pipeline_end_s
    assert step(BRIDGE_70B) != even


@pytest.mark.parametrize("layout,words", [
    ("Ettt|(tt|)*29,m|L", "multi-token prediction"),
    ("tE|t*79L", "embedding (E) must open"),
    ("Et*80", "loss (L) must close"),
    ("Et*40|t*40L|L", "loss (L) must close"),
    ("Ex|t*80L", "'x' is not a layout character"),
    ("E(t*2|)*|t*78L", "repeat is malformed"),
])
def test_a_malformed_layout_is_one_line_naming_the_field(layout, words, capsys):
    code = main(["run", str(LLAMA70), "--set", f"parallel.layers_per_stage={layout}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "parallel.layers_per_stage" in err and words in err


def test_a_layout_of_the_wrong_size_is_refused_where_a_list_is():
    loaded = load_scenario(LLAMA70, [*INTERLEAVED, "parallel.layers_per_stage=Et*2|(t*2|)*38L"])  # 40 chunks, 78 layers
    with pytest.raises(InputError) as error:
        resolve_layout(loaded.scenario)
    assert error.value.field == "parallel.layers_per_stage" and "sums to 78" in str(error.value)
    loaded = load_scenario(LLAMA70, [*INTERLEAVED, "parallel.layers_per_stage=Et*40|t*40L"])  # 2 chunks
    with pytest.raises(InputError) as error:
        resolve_layout(loaded.scenario)
    assert "has 2 entries, needs pp x vpp = 40" in str(error.value)


def test_a_mistyped_auto_still_names_the_choices(capsys):
    assert main(["run", str(LLAMA70), "--set", "parallel.layers_per_stage=atuo"]) == 2
    assert "layout string or auto" in capsys.readouterr().err
