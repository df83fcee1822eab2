"""Plain PyTorch layers (``training.transformer_impl: pytorch``): every weight gradient written
fresh and added into ``.grad`` by autograd's AccumulateGrad, one kernel per parameter tensor
per backward; and every block lists its parameter tensors."""

from __future__ import annotations

import pytest

from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.attention import self_attention
from mpsim.workload.blocks import LayerContext
from mpsim.workload.embedding import embedding_block, head_block, padded_vocab
from mpsim.workload.layer_stack import stack_env, unit_works
from mpsim.workload.ops import compute_ops
from mpsim.workload.stages import layer_context, stage_options
from mpsim.workload.transformer import layer_work
from tests.conftest import SCENARIOS

VALIDATION = SCENARIOS / "validation_2xcpu.yaml"  # the validation model: transformer_impl pytorch
GPT = SCENARIOS / "megatron_22b_8xa100.yaml"


def stages_of(path, *overrides: str):
    scenario = load_scenario(path, list(overrides)).scenario
    layout = resolve(scenario)
    return scenario, layout, build_workload(scenario, layout).stages


def named(passes, suffix: str) -> list:
    return [op for block in passes for op in compute_ops(block.items) if op.name.endswith(suffix)]


def test_each_parameter_tensor_is_accumulated_once_per_backward():
    scenario, layout, stages = stages_of(VALIDATION)
    model = scenario.model
    h, ffn = model.hidden_size, model.ffn_hidden_size
    # per layer: two layernorms (scale, shift), QKV, projection, FC1, FC2 (weight, bias each)
    per_layer = sorted([h] * 4 + [3 * h * h, 3 * h, h * h, h, h * ffn, ffn, ffn * h, h])
    stage = stages[1]  # the last stage: layers, final norm and an untied LM head
    adds = named(stage.backward, ".accumulate_grad")
    layer_adds = [op for op in adds if op.name.startswith("layer 0.")]
    grad_bytes = scenario.training.grad_bytes
    assert sorted(op.bytes / (3 * grad_bytes) for op in layer_adds) == pytest.approx(per_layer)
    # the same kernels in the weight-gradient pass of a split backward, none in its input half
    assert len(named(stage.backward_weight, ".accumulate_grad")) == len(adds)
    assert not named(stage.backward_input, ".accumulate_grad")
    # the parameters accumulated are the stage's parameters
    assert sum(op.bytes for op in adds) == pytest.approx(3 * grad_bytes * stage.params)


def test_plain_pytorch_writes_weight_gradients_fresh_and_megatron_accumulates_them_in_the_gemm():
    _, _, pytorch = stages_of(VALIDATION)
    _, _, local = stages_of(VALIDATION, "training.transformer_impl=local")
    fresh = {op.name: op for op in named(pytorch[0].backward, ".wgrad") if op.kind == "gemm"}
    fused = {op.name: op for op in named(local[0].backward, ".wgrad") if op.kind == "gemm"}
    assert fresh.keys() == fused.keys() and fresh
    for name, op in fresh.items():
        # the fused GEMM reads the accumulated gradient back: one more pass over C
        assert op.bytes < fused[name].bytes, name
    assert not named(local[0].backward, ".accumulate_grad")
    # the embedding's gradient table is zeroed before the tokens' gradients are added into it, in
    # both: autograd's embedding backward builds a dense table whatever the framework
    assert named(pytorch[0].backward, "embedding.wgrad.zero") and named(local[0].backward, "embedding.wgrad.zero")
    # Megatron fuses accumulation into its linear layers only: its hook adds the whole dense table
    # into main_grad (read both, write the sum); plain PyTorch's AccumulateGrad adds it into .grad
    (add,) = named(local[0].backward, "embedding.wgrad.main_grad_add")
    (zero,) = named(local[0].backward, "embedding.wgrad.zero")
    scenario = load_scenario(VALIDATION, ["training.transformer_impl=local"]).scenario
    act, acc = 2 if scenario.training.dtype in ("bf16", "fp16") else 4, scenario.training.grad_bytes
    assert add.bytes == pytest.approx(zero.bytes / act * (act + 2 * acc))
    assert not named(pytorch[0].backward, "main_grad_add")


def test_plain_pytorch_adds_biases_in_the_gemm_and_sums_their_gradients():
    _, _, stages = stages_of(VALIDATION)
    assert not named(stages[0].forward, ".bias")
    assert named(stages[0].backward, ".bias.grad")


def test_the_accumulation_kernels_cost_time():
    # against Transformer Engine's layers: the same model without the adds or the bias kernels
    pytorch = summarize(simulate(load_scenario(VALIDATION).scenario))
    fused = summarize(simulate(load_scenario(VALIDATION, ["training.transformer_impl=transformer_engine"]).scenario))
    assert pytorch.step_time_s > fused.step_time_s


def test_plain_pytorch_cannot_run_fp8():
    scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml",
                             ["training.dtype=fp8", "training.transformer_impl=pytorch"]).scenario
    with pytest.raises(InputError, match=r"training\.transformer_impl.*pytorch.*dtype: fp8"):
        resolve(scenario)


@pytest.mark.parametrize("name", sorted(p.name for p in SCENARIOS.glob("*.yaml")))
def test_every_block_lists_its_parameter_tensors(name):
    """The tensors a block lists add up to its parameters (dense and expert), in every shipped scenario."""
    scenario = load_scenario(SCENARIOS / name).scenario
    layout = resolve(scenario)
    if scenario.model.kind == "stack":
        for unit in unit_works(scenario.model, stack_env(scenario, layout)):
            assert sum(unit.work.param_tensors) == pytest.approx(unit.work.params, rel=1e-12), unit.label
        return
    ctx = layer_context(scenario, layout)
    options = stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp))
    works = [layer_work(ctx, options.mla, None, options.bias, options.norm_params),
             embedding_block(ctx, options.vocab_local, options.learned_positions),
             head_block(ctx, options.vocab_local, options.norm_params, with_weights=True)]
    if options.moe is not None:
        works.append(layer_work(ctx, options.mla, options.moe, options.bias, options.norm_params))
    for work in works:
        total = work.params + getattr(work, "expert_params", 0.0)
        assert sum(work.param_tensors) == pytest.approx(total, rel=1e-12), type(work).__name__


def test_an_attention_layer_lists_weights_and_biases_apart():
    ctx = LayerContext(microbatch_size=1, seq_length=128, hidden=512, heads=8, kv_heads=8, head_dim=64,
                       ffn_hidden=2048, gated_ffn=False, tp=1, sequence_parallel=False, flash_attention=True,
                       dropout=False, rope=False, layers_impl="pytorch")
    assert self_attention(ctx, None, True).param_tensors == (512 * 1536, 1536, 512 * 512, 512)
    assert self_attention(ctx, None, False).param_tensors == (512 * 1536, 512 * 512)
