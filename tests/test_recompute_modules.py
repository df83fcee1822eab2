"""Megatron-Core's recompute modules (``parallel.recompute_modules`` with ``parallel.recompute:
selective``): what each layer runs again before its backward, and what its forward stops
keeping; where a module has nothing to recompute (a norm fused into Transformer Engine's
linear) nothing changes; and the settings that make no sense are refused with the field named."""

from __future__ import annotations

from itertools import combinations

import pytest

from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload.embedding import padded_vocab
from mpsim.workload.stages import build_stage, layer_context, stage_options
from tests.conftest import SCENARIOS
from tests.test_moe_host_sync import MIXTRAL

LLAMA = SCENARIOS / "llama3_70b_32xh100.yaml"  # dense
MODULES = ("core_attn", "moe_act", "layernorm")


def run(path, *overrides: str):
    return summarize(simulate(load_scenario(path, list(overrides)).scenario))


def recompute_block(path, *overrides: str) -> list[str]:
    scenario = load_scenario(path, list(overrides)).scenario
    layout = resolve(scenario)
    work = build_stage(layer_context(scenario, layout), 1, 0, False, False,
                       stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp)))
    return [getattr(item, "name", "") for block in work.backward if block.category == "recompute"
            for item in block.items]


def test_the_default_is_the_attention_core_and_none_is_no_recompute():
    selective = run(MIXTRAL)  # recompute: selective
    named = run(MIXTRAL, "parallel.recompute_modules=[core_attn]")
    assert (named.step_time_s, named.peak_memory_bytes) == (selective.step_time_s, selective.peak_memory_bytes)
    nothing = run(MIXTRAL, "parallel.recompute_modules=[]")
    plain = run(MIXTRAL, "parallel.recompute=none")
    assert (nothing.step_time_s, nothing.peak_memory_bytes) == (plain.step_time_s, plain.peak_memory_bytes)


def test_moe_act_and_layernorm_run_their_ops_again_and_keep_less():
    names = recompute_block(MIXTRAL, "parallel.recompute_modules=[moe_act,layernorm]")
    # a MoE layer's pre-MLP norm is a module of its own; the experts' activation; no attention core
    assert "moe.norm" in names and "moe.experts.act" in names
    assert not any(name.startswith("attn.flash") or name.startswith("attn.core") for name in names)
    base = run(MIXTRAL, "parallel.recompute_modules=[]")
    act = run(MIXTRAL, "parallel.recompute_modules=[moe_act]")
    assert act.peak_memory_bytes < base.peak_memory_bytes and act.step_time_s > base.step_time_s


@pytest.mark.parametrize("impl,norms", [
    # Megatron's local layers keep both norms modules of their own; Transformer Engine fuses them
    # into LayerNormLinear and LayerNormMLP, leaving layernorm nothing to recompute in a dense layer
    ("local", {"attn.norm", "mlp.norm"}), ("transformer_engine", set()),
])
def test_layernorm_recomputes_the_norms_that_are_modules_of_their_own(impl, norms):
    overrides = ("parallel.recompute=selective", f"training.transformer_impl={impl}")
    names = recompute_block(LLAMA, *overrides, "parallel.recompute_modules=[layernorm]")
    assert set(names) == norms
    with_norms = run(LLAMA, *overrides, "parallel.recompute_modules=[layernorm]")
    without = run(LLAMA, *overrides, "parallel.recompute_modules=[]")
    if norms:
        assert with_norms.peak_memory_bytes < without.peak_memory_bytes
    else:
        assert with_norms.peak_memory_bytes == without.peak_memory_bytes
        assert with_norms.step_time_s == without.step_time_s


@pytest.mark.parametrize("smaller,larger", [(a, b) for b in (frozenset(c) for n in range(4) for c in combinations(
    MODULES, n)) for a in (frozenset(c) for n in range(4) for c in combinations(MODULES, n)) if a < b])
def test_recomputing_more_never_keeps_more_nor_runs_less(smaller, larger):
    def modules(group):
        return f"parallel.recompute_modules=[{','.join(sorted(group))}]"
    few, more = run(MIXTRAL, modules(smaller)), run(MIXTRAL, modules(larger))
    assert more.peak_memory_bytes <= few.peak_memory_bytes
    assert more.step_time_s >= few.step_time_s - 1e-12


def test_whole_modules_run_again_from_their_input():
    # a dense MLP: its GEMMs and activation, and under Transformer Engine the norm fused into
    # LayerNormMLP; the local layers' MLP module starts after its norm
    te = recompute_block(LLAMA, "parallel.recompute=selective", "training.transformer_impl=transformer_engine",
                         "parallel.recompute_modules=[mlp]")
    local = recompute_block(LLAMA, "parallel.recompute=selective", "training.transformer_impl=local",
                            "parallel.recompute_modules=[mlp]")
    assert "mlp.norm" in te and "mlp.norm" not in local
    assert {"mlp.fc1", "mlp.act", "mlp.fc2"} <= set(te) & set(local)
    # the whole MoE layer: its dispatch and combine run again, and the host waits for the counts again
    moe = recompute_block(MIXTRAL, "parallel.recompute_modules=[moe]")
    assert {"moe.router", "moe.dispatch_all_to_all", "moe.experts.fc1", "moe.combine_all_to_all"} <= set(moe)
    act, whole = run(MIXTRAL, "parallel.recompute_modules=[moe_act]"), run(MIXTRAL, "parallel.recompute_modules=[moe]")
    assert whole.peak_memory_bytes < act.peak_memory_bytes and whole.step_time_s > act.step_time_s
    full = run(MIXTRAL, "parallel.recompute=full")
    assert full.peak_memory_bytes < whole.peak_memory_bytes and full.step_time_s > whole.step_time_s
    dense, mlp = (run(LLAMA, "parallel.recompute=selective", f"parallel.recompute_modules={modules}")
                  for modules in ("[]", "[mlp]"))
    assert mlp.peak_memory_bytes < dense.peak_memory_bytes and mlp.step_time_s > dense.step_time_s


def test_mla_up_proj_runs_the_up_projections_again_and_drops_what_they_made():
    deepseek = SCENARIOS / "deepseek_v3_2048xh100.yaml"
    names = recompute_block(deepseek, "parallel.recompute=selective", "parallel.recompute_modules=[mla_up_proj]")
    assert {"attn.q_up", "attn.kv_up", "attn.rope"} <= set(names) and "attn.down" not in names
    kept, dropped = (run(deepseek, "parallel.recompute=selective", f"parallel.recompute_modules={modules}")
                     for modules in ("[]", "[mla_up_proj]"))
    assert dropped.peak_memory_bytes < kept.peak_memory_bytes and dropped.step_time_s > kept.step_time_s


@pytest.mark.parametrize("path,overrides,message", [
    (MIXTRAL, ("parallel.recompute=none", "parallel.recompute_modules=[moe_act]"), "parallel.recompute: selective"),
    (LLAMA, ("parallel.recompute=selective", "parallel.recompute_modules=[moe_act]"), "no MoE layers"),
    (MIXTRAL, ("parallel.recompute_modules=[moe,moe_act]",), "name one"),
    (LLAMA, ("parallel.recompute=selective", "parallel.recompute_modules=[mla_up_proj]"), "set model.mla"),
    (MIXTRAL, ("parallel.recompute_modules=[shared_experts]",), "none"),
    (MIXTRAL, ("parallel.recompute_modules=[mlp]",), "every layer of the model is a MoE layer"),
    (MIXTRAL, ("parallel.recompute_modules=[moe]", "training.cuda_graph_modules=[moe_router]"), "CUDA graph"),
    (LLAMA, ("parallel.recompute=selective", "training.transformer_impl=pytorch",
             "parallel.recompute_modules=[core_attn]"), "transformer_impl pytorch"),
])
def test_what_makes_no_sense_names_the_field(path, overrides, message):
    with pytest.raises(InputError) as raised:
        resolve(load_scenario(path, list(overrides)).scenario)
    assert raised.value.field == "parallel.recompute_modules" and message in str(raised.value)


def test_the_summary_says_what_is_recomputed_and_captured():
    from mpsim.results.report import format_summary
    summary = run(MIXTRAL, "parallel.recompute_modules=[moe_act,layernorm]", "training.cuda_graph_modules=[attn]")
    assert (summary.recompute, summary.recompute_modules, summary.cuda_graph_modules) == (
        "selective", ("moe_act", "layernorm"), ("attn",))
    layout = next(line for line in format_summary(summary).splitlines() if line.strip().startswith("layout"))
    assert layout.endswith("; recompute moe_act, layernorm; CUDA graphs of attn")
    plain = run(MIXTRAL, "parallel.recompute=none")
    assert plain.recompute_modules == () and "recompute" not in next(
        line for line in format_summary(plain).splitlines() if line.strip().startswith("layout"))
