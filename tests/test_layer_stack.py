"""Layer stacks: the generic model description agrees with the transformer path and with the papers."""

from __future__ import annotations

import json

import pytest

from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario, resolve_layout
from mpsim.specs.layers import LinearLayer
from mpsim.specs.stack import stack_units
from mpsim.specs.stack_tp import plan_tensor_parallel
from mpsim.workload import build_workload
from mpsim.workload.flops import model_flops_per_sequence
from tests.conftest import ROOT, SCENARIOS, CliRun, run_in_process
from tests.transformer_stack import stack_layers_per_stage, transformer_as_stack


def as_stack(path: str, *overrides: str):
    """(transformer scenario, the same written as a layer stack with the same split)."""
    scenario = load_scenario(path, list(overrides)).scenario
    layout = resolve_layout(scenario)
    stack = transformer_as_stack(scenario.model, layout.tp)
    plan = scenario.parallel.model_copy(update={"layers_per_stage": stack_layers_per_stage(layout.layers_per_chunk)})
    return scenario, scenario.model_copy(update={"model": stack, "parallel": plan})


@pytest.mark.parametrize("path,overrides", [
    ("gpt3_175b_64xa100.yaml", ()),  # TP 8 + SP, selective recompute, unfused attention, interleaved, tied
    ("gpt3_175b_64xa100.yaml", ("parallel.sequence_parallel=false", "parallel.recompute=full")),
    ("gpt3_175b_64xa100.yaml", ("training.attention=flash", "parallel.zero_stage=3", "parallel.schedule=zbv",
                                "parallel.vpp=2")),
    ("llama3_70b_32xh100.yaml", ()),  # SwiGLU, RoPE, GQA, RMSNorm, no biases, untied
])
def test_transformer_as_a_stack_has_the_same_step_time(path, overrides):
    transformer, stack = as_stack(str(SCENARIOS / path), *overrides)
    expected, got = summarize(simulate(transformer)), summarize(simulate(stack))
    assert got.step_time_s == pytest.approx(expected.step_time_s, rel=1e-12)
    assert got.bubble_s == pytest.approx(expected.bubble_s, rel=1e-9, abs=1e-12)
    assert got.hardware_flops_per_step == pytest.approx(expected.hardware_flops_per_step, rel=1e-12)
    # every rank but the last holds the same memory; the last keeps the LM head's input
    # sharded under sequence parallelism (as Megatron does) where the transformer path keeps it whole
    for mine, theirs in zip(got.memory[:-1], expected.memory[:-1]):
        assert mine.peak_memory_bytes == pytest.approx(theirs.peak_memory_bytes, rel=1e-12)
    assert got.memory[-1].params == expected.memory[-1].params
    assert got.memory[-1].peak_memory_bytes == pytest.approx(expected.memory[-1].peak_memory_bytes, rel=0.01)


def test_gpt3_stack_model_flops_are_the_transformer_formula():
    transformer, stack = as_stack(str(SCENARIOS / "gpt3_175b_64xa100.yaml"))
    assert model_flops_per_sequence(stack.model) == pytest.approx(model_flops_per_sequence(transformer.model),
                                                                  rel=1e-12)


@pytest.mark.parametrize("scenario,params,rel", [
    ("vit_h14_32xa100.yaml", 632e6, 0.01),  # Dosovitskiy et al. 2021, Table 1
    ("vit_22b_512xh100.yaml", 21.7e9, 0.02),  # Dehghani et al. 2023, Table 1 (21.743B)
    ("wav2vec2_large_16xa100.yaml", 317e6, 0.02),  # Baevski et al. 2020, Sec. 4.2
])
def test_shipped_stacks_have_the_papers_parameter_counts(scenario, params, rel):
    loaded = load_scenario(SCENARIOS / scenario, ["parallel.tp=1", "parallel.pp=1", "parallel.layers_per_stage=null",
                                                  "parallel.dp=null", "parallel.zero_stage=0"])
    layout = resolve_layout(loaded.scenario)
    workload = build_workload(loaded.scenario, layout)
    head = sum(p.layer.out_features * p.in_shape[-1] + p.layer.out_features
               for unit in stack_units(loaded.scenario.model) for p in unit.layers
               if isinstance(p.layer, LinearLayer) and p.layer.name in ("classes", "pre_logits"))
    # the papers count the backbone; the classifier depends on the dataset
    assert sum(stage.params for stage in workload.stages) - head == pytest.approx(params, rel=rel)


def test_vit_h14_forward_flops_are_the_encoder_closed_form():
    model = load_scenario(SCENARIOS / "vit_h14_32xa100.yaml").scenario.model
    t, h, layers = 257, 1280, 32
    encoder = layers * (24 * t * h * h + 4 * t * t * h)
    patches = 2 * 256 * 3 * 14 * 14 * h
    head = 2 * h * h + 2 * h * 18291
    assert model_flops_per_sequence(model) == pytest.approx(3 * (encoder + patches + head), rel=1e-12)


def test_shapes_are_inferred_layer_by_layer():
    model = load_scenario(SCENARIOS / "deepspeech2_8xa100.yaml").scenario.model
    units = stack_units(model)
    assert [u.out_shape for u in units[:3]] == [(32, 81, 500), (32, 41, 500), (96, 21, 500)]
    assert units[5].layers[1].in_shape == (500, 2016) and units[5].out_shape == (500, 2048)
    assert model.num_layers == 3 + 2 + 7 + 1
    wav2vec = load_scenario(SCENARIOS / "wav2vec2_large_16xa100.yaml").scenario.model
    frames = [u.out_shape[-1] for u in stack_units(wav2vec)[:7]]
    assert frames == [63999, 31999, 15999, 7999, 3999, 1999, 999]  # 20 ms frames of 16 kHz audio


def test_tensor_parallel_plan_is_megatrons_column_row_pairs():
    model = load_scenario(SCENARIOS / "vit_22b_512xh100.yaml").scenario.model
    plan = plan_tensor_parallel(model, 8, False)
    block = dict(zip((p.label.split(".")[-1] for p in stack_units(model)[4].layers), plan[4]))
    assert block == {"ln": "whole", "attention": "heads", "fc1": "column", "gelu": "shard", "fc2": "row",
                     "residual": "whole"}
    assert plan[0] == ("replicate",)  # the patch embedding runs whole on every TP rank
    assert plan[-1] == ("whole", "whole", "column", "vocab")  # classes split, vocab-parallel loss


def test_tensor_parallel_splits_the_work_of_a_vit_block():
    one = load_scenario(SCENARIOS / "vit_22b_512xh100.yaml", ["parallel.tp=1", "parallel.dp=128"]).scenario
    eight = load_scenario(SCENARIOS / "vit_22b_512xh100.yaml").scenario
    flops = []
    for scenario in (one, eight):
        work = build_workload(scenario, resolve_layout(scenario)).stages[1]
        flops.append(sum(op.flops for block in work.forward for op in block.items if hasattr(op, "flops")))
    assert flops[1] == pytest.approx(flops[0] / 8, rel=1e-12)


def run_cli(*args: str, cwd=ROOT) -> CliRun:
    return run_in_process(args, cwd)


STACK = """kind: stack
name: tiny
input_shape: [16, 64]
layers:
  - {kind: layernorm}
  - {kind: LAYER}
  - {kind: linear, out_features: 8}
  - {kind: cross_entropy}
"""

SCENARIO = """name: tiny
cluster: {system: dgx-a100, nodes: 1}
model: tiny.yaml
parallel: {tp: TP, pp: 1, microbatch_size: 1, global_batch_size: 8}
"""


@pytest.mark.parametrize("layer,tp,fragments", [
    ("lstmx, hidden_size: 64", 1, ["tiny.yaml", "layers.1.kind", "unknown layer kind 'lstmx'", "lstm"]),
    ("lstm, hidden_size: 64", 2, ["tiny.yaml", "layers.1", "'lstm0' (lstm)", "cannot be split", "tp=2"]),
    ("linear, out_features: 32, tp: column", 2, ["tiny.yaml", "layers.1", "joins them"]),
    ("linear, out_features: 32, in_features: 63", 1, ["tiny.yaml", "layers.1", "in_features=63", "64 features"]),
    ("conv2d, out_channels: 4, kernel_size: 3", 1, ["tiny.yaml", "layers.1", "(channels, height, width)"]),
])
def test_bad_stacks_are_one_line_naming_file_and_layer(tmp_path, layer, tp, fragments):
    (tmp_path / "tiny.yaml").write_text(STACK.replace("LAYER", layer))
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("TP", str(tp)))
    result = run_cli("run", "s.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_deepspeech2_with_tensor_parallelism_names_the_recurrent_layer():
    result = run_cli("run", str(SCENARIOS / "deepspeech2_8xa100.yaml"), "--set", "parallel.tp=2",
                     "--set", "parallel.pp=1", "--set", "parallel.layers_per_stage=null")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and "deepspeech2.yaml" in line and "layers.5.layers.1" in line
    assert "'recurrent 0.bigru' (gru) cannot be split over tensor parallelism" in line


def test_unknown_model_kind_is_one_line(tmp_path):
    (tmp_path / "tiny.yaml").write_text(STACK.replace("kind: stack", "kind: torch").replace("LAYER", "gelu"))
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("TP", "1"))
    result = run_cli("run", "s.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "unknown model kind 'torch'" in result.stderr
    assert "import-torch" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["vit_h14_32xa100", "vit_22b_512xh100", "wav2vec2_large_16xa100",
                                  "deepspeech2_8xa100"])
def test_shipped_stack_scenarios_run_and_fit(name):
    summary = summarize(simulate(load_scenario(SCENARIOS / f"{name}.yaml").scenario))
    assert summary.step_time_s > 0 and not summary.out_of_memory
    assert 0.01 < summary.mfu < 0.7


def test_example_scenario_file_is_shipped():
    assert (ROOT / "examples" / "cnn_transformer.yaml").is_file()


def test_planner_enumerates_only_the_tensor_parallel_sizes_a_stack_can_take(tmp_path):
    out = tmp_path / "plan.jsonl"
    for model, allowed in (("deepspeech2", {1}), ("vit-h14", {1, 2, 4, 8})):
        out.unlink(missing_ok=True)
        result = run_cli("plan", model, "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "64", "--top",
                         "1", "--no-progress", "--out", str(out))
        assert result.returncode == 0, result.stderr
        sizes = {json.loads(line)["point"]["parallel.tp"] for line in out.read_text().splitlines()}
        assert sizes == allowed  # the GRUs refuse any tp > 1; ViT-H's 16 heads split up to 8


def test_each_stage_boundary_of_a_stack_sends_its_own_activation():
    # wav2vec 2.0 cut after its second conv layer: that cut carries the 512-channel feature map at a
    # fine stride, 16x what crosses a cut between transformer blocks
    scenario = load_scenario(SCENARIOS / "wav2vec2_large_16xa100.yaml", ["parallel.layers_per_stage=[2,11,7,16]"]
                             ).scenario
    result = simulate(scenario)
    cuts = result.workload.cut_bytes
    assert cuts[0] > 10 * cuts[1] and cuts[1] == cuts[2]
    assert result.workload.p2p_bytes == max(cuts[:-1])
    seconds = result.engine_input.transfer_s
    assert seconds[(0, 1)] == seconds[(1, 0)] > 5 * seconds[(1, 2)]
    assert seconds[(1, 2)] == seconds[(2, 1)] == seconds[(2, 3)]
    # the transformer path has one size: every cut carries p2p_bytes
    gpt = simulate(load_scenario(SCENARIOS / "gpt3_175b_64xa100.yaml").scenario)
    assert gpt.workload.cut_bytes == () and gpt.workload.boundary_bytes(3) == gpt.workload.p2p_bytes
