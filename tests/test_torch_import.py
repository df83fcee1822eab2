"""PyTorch interop: the stacks' FLOPs against PyTorch's FLOP counter, and a user's model end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from mpsim.specs import load_scenario
from mpsim.specs.layers import CustomLayer
from mpsim.workload.layers import forward_flops_per_sample
from tests.conftest import ROOT, SCENARIOS, CliRun, run_in_process

EXAMPLE = ROOT / "examples"


def run_cli(*args: str, cwd) -> CliRun:
    """``mpsim ARGS`` in this process (torch is imported once, not once per command)."""
    return run_in_process(args, cwd)


def run_process(*args: str, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpsim", *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.mark.parametrize("name", ["vit_h14_32xa100", "vit_22b_512xh100", "wav2vec2_large_16xa100",
                                  "deepspeech2_8xa100"])
def test_forward_flops_per_layer_match_pytorchs_counter(name):
    pytest.importorskip("torch")
    from tests.torch_stack_modules import layer_flops

    stack = load_scenario(SCENARIOS / f"{name}.yaml").scenario.model
    checked = 0
    for placed, counted in layer_flops(stack):
        if isinstance(placed.layer, CustomLayer):
            continue  # a custom layer states its own costs
        mine = forward_flops_per_sample(placed)
        assert mine == pytest.approx(counted, rel=0.02, abs=1.0), placed.label
        checked += counted > 0
    assert checked >= 4  # convolutions, projections, attention, recurrences were all compared


def test_imported_example_simulates_end_to_end(tmp_path):
    pytest.importorskip("torch")
    target = tmp_path / "cnn.yaml"
    made = run_cli("import-torch", "examples/cnn_transformer.py:build", "--input-shape", "3,64,64", "-o", str(target),
                   cwd=ROOT)
    assert made.returncode == 0, made.stderr
    imported = yaml.safe_load(target.read_text())
    shipped = yaml.safe_load((EXAMPLE / "cnn_transformer.yaml").read_text())
    assert imported["layers"] == shipped["layers"]  # the shipped file is what the command writes
    kinds = [layer["kind"] for layer in imported["layers"]]
    assert kinds[:6] == ["conv2d", "batchnorm", "elementwise", "conv2d", "batchnorm", "elementwise"]
    assert kinds.count("custom") == 8 + 2 and kinds[-1] == "block"
    assert [layer["kind"] for layer in imported["layers"][-1]["layers"]] == ["linear", "cross_entropy"]
    assert all(layer["tp"] == "replicate" for layer in imported["layers"] if layer["kind"] == "custom")
    block = imported["layers"][7]
    # a pre-norm block of width 256 over 256 tokens: 24 t d^2 + 4 t^2 d forward FLOPs, 2x backward
    t, d = 256, 256
    assert block["forward_flops"] == pytest.approx(24 * t * d * d + 4 * t * t * d, rel=1e-9)
    assert block["backward_flops"] == pytest.approx(2 * block["forward_flops"], rel=1e-9)
    assert block["params"] == 12 * d * d + 13 * d
    ran = run_cli("run", str(EXAMPLE / "cnn_transformer_scenario.yaml"), "--set", f"model={target}", "--json",
                  cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["layer_split"] == "auto" and sum(summary["layers_per_stage"]) == len(kinds)
    assert summary["step_time_s"] > 0 and not summary["out_of_memory"]


def test_example_runs_from_its_shipped_file():
    result = run_cli("run", str(EXAMPLE / "cnn_transformer_scenario.yaml"), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "(auto split)" in result.stdout


@pytest.mark.parametrize("factory,fragments", [
    ("examples/no_such_model.py:build", ["examples/no_such_model.py", "factory file not found"]),
    ("examples/cnn_transformer.py:no_such_function", ["examples/cnn_transformer.py", "no function 'no_such_function'"]),
    ("no_such_package.models:build", ["cannot import module 'no_such_package.models'"]),
    ("examples/cnn_transformer.py", ["FILE.py:FUNCTION"]),
])
def test_bad_factory_is_one_line(factory, fragments):
    pytest.importorskip("torch")
    result = run_cli("import-torch", factory, "--input-shape", "3,64,64", cwd=ROOT)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_factory_whose_model_fails_on_meta_is_one_line(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "broken.py").write_text(
        "import torch\n\nclass Broken(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n        return self.fc(x.reshape(-1, 5))\n\n"
        "def build():\n    return Broken()\n")
    result = run_cli("import-torch", "broken.py:build", "--input-shape", "4", cwd=tmp_path)
    assert result.returncode == 2 and "forward pass on meta tensors failed" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_torch_the_command_says_how_to_install_it(tmp_path):
    blocker = tmp_path / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = run_process("import-torch", "examples/cnn_transformer.py:build", "--input-shape", "3,64,64", cwd=ROOT,
                     env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: PyTorch is needed to import a model: pip install 'mpsim[calibrate]' " \
                                    "(torch>=2.12)"


def _import_and_count(factory: str, shape: str, target, sample, *options: str):
    """The stack ``import-torch`` writes for ``factory`` (tests/FILE.py:NAME), and its forward
    FLOPs per sample next to PyTorch's counter on the whole model for a meta batch of 3."""
    import importlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mpsim.specs.stack import LayerStackSpec
    from mpsim.workload.layer_stack import stack_units

    made = run_cli("import-torch", factory, "--input-shape", shape, *options, "-o", str(target), cwd=ROOT)
    assert made.returncode == 0, made.stderr
    stack = LayerStackSpec.model_validate(yaml.safe_load(target.read_text()))
    module, name = factory.removesuffix(".py").replace(".py:", ":").split(":")
    with torch.device("meta"):
        model = getattr(importlib.import_module(module.replace("/", ".")), name)()
        batch = sample()
    model.train()
    counter = FlopCounterMode(display=False)
    with counter:
        model(batch)
    ours = sum(forward_flops_per_sample(placed) for unit in stack_units(stack) for placed in unit.layers)
    return stack, ours, counter.get_total_flops() / 3


HF_MODELS = [("llama", "cross_entropy", "model.layers."), ("gpt2", "cross_entropy", "transformer.h."),
             ("bert", "none", "encoder.layer.")]


@pytest.mark.parametrize("name,loss,blocks", HF_MODELS)
def test_hugging_face_models_import_one_unit_per_block_with_torchs_flops(name, loss, blocks, tmp_path, capsys):
    """LlamaForCausalLM, GPT-2 and BERT from their configs: each decoder/encoder block is one
    layer of the stack (so a pipeline can cut between any two), the stack's forward FLOPs are
    those of PyTorch's counter on the whole model, and the stack simulates."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    target = tmp_path / f"{name}.yaml"
    stack, ours, counted = _import_and_count(f"tests/hf_models.py:{name}", "128", target,
                                             lambda: torch.zeros((3, 128), dtype=torch.long), "--token-ids",
                                             "--loss", loss)
    names = [layer.name for layer in stack.layers]
    assert [n for n in names if n.startswith(blocks)] == [f"{blocks}{i}" for i in range(4)]
    for layer in stack.layers:
        if layer.name.startswith(blocks):  # each block as typed layers: attention split by heads, the MLP by width
            kinds = [part.kind for part in layer.layers]
            assert layer.kind == "block" and kinds.count("attention") == 1 and kinds.count("linear") == 2
    assert ours == pytest.approx(counted, rel=0.02)
    from mpsim.cli.main import main

    for tp in (1, 2):
        assert main(["run", str(EXAMPLE / "cnn_transformer_scenario.yaml"), "--set", f"model={target}", "--set",
                     f"parallel.tp={tp}", "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert sum(summary["layers_per_stage"]) == len(names)
        assert (summary["exposed_tp_comm_s"] > 0) == (tp > 1)  # split blocks all-reduce their outputs


@pytest.mark.parametrize("factory,typed", [("stack", True), ("anonymous", False)])
def test_a_transformer_block_imports_as_typed_layers_only_when_its_heads_are_known(factory, typed, tmp_path):
    pytest.importorskip("torch")
    target = tmp_path / "blocks.yaml"
    made = run_cli("import-torch", f"tests/typed_blocks.py:{factory}", "--input-shape", "16,64", "--loss", "none",
                   "-o", str(target), cwd=ROOT)
    assert made.returncode == 0, made.stderr
    layers = yaml.safe_load(target.read_text())["layers"]
    assert [layer["kind"] for layer in layers] == (["block"] * 2 if typed else ["custom"] * 2)
    if typed:
        assert [part["kind"] for part in layers[0]["layers"]] == [
            "layernorm", "attention", "elementwise", "layernorm", "linear", "elementwise", "linear", "elementwise"]
        assert layers[0]["layers"][1]["num_heads"] == 4 and not layers[0]["layers"][1]["causal"]


@pytest.mark.parametrize("name,unit,blocks", [("resnet50", r"layer\d\.\d+", 16),
                                              ("vit_b_16", r"encoder\.layers\.encoder_layer_\d+", 12)])
def test_torchvision_models_import_one_unit_per_block_with_torchs_flops(name, unit, blocks, tmp_path, capsys):
    """ResNet-50 (16 bottlenecks) and ViT-B/16 (12 encoder blocks) where torchvision is installed
    (the CI's CPU torch has no matching torchvision, so there this skips)."""
    import re

    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from mpsim.cli.main import main

    target = tmp_path / f"{name}.yaml"
    stack, ours, counted = _import_and_count(f"tests/torchvision_models.py:{name}", "3,224,224", target,
                                             lambda: torch.empty((3, 3, 224, 224)))
    assert sum(bool(re.fullmatch(unit, layer.name)) for layer in stack.layers) == blocks
    assert ours == pytest.approx(counted, rel=0.02)
    # ViT's encoder blocks (nn.MultiheadAttention and an MLP) read as typed layers and split
    # over tensor-parallel ranks; ResNet's bottlenecks are convolutions kept whole
    typed = name == "vit_b_16"
    assert all((layer.kind == "block") == typed for layer in stack.layers if re.fullmatch(unit, layer.name))
    for tp in ((1, 2) if typed else (1,)):
        assert main(["run", str(EXAMPLE / "cnn_transformer_scenario.yaml"), "--set", f"model={target}", "--set",
                     f"parallel.tp={tp}", "--json"]) == 0
        assert sum(json.loads(capsys.readouterr().out)["layers_per_stage"]) == len(stack.layers)


def test_token_ids_into_a_first_linear_layer_are_refused(tmp_path):
    pytest.importorskip("torch")
    factory = tmp_path / "mlp.py"
    factory.write_text("import torch.nn as nn\n\ndef build():\n"
                       "    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))\n")
    made = run_cli("import-torch", f"{factory}:build", "--input-shape", "16", "--token-ids", "-o",
                   str(tmp_path / "mlp.yaml"), cwd=ROOT)
    assert made.returncode == 2 and not (tmp_path / "mlp.yaml").exists()
    assert made.stderr.strip().splitlines() == [
        "error: --token-ids: the model's first layer '0' is a linear layer, which takes numbers, not token ids "
        "(an embedding takes them); leave --token-ids out"]
    # without the flag the same model imports
    assert run_cli("import-torch", f"{factory}:build", "--input-shape", "16", "-o", str(tmp_path / "mlp.yaml"),
                   cwd=ROOT).returncode == 0
