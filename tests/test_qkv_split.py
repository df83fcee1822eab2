"""The copies around the packed QKV output in Megatron-Core with Transformer Engine
(``mpsim/workload/attention.py`` ``qkv_split``), worked out by hand for Llama 3 70B (64 query
heads, 8 KV groups, head size 128, 8,192 tokens, TP 8: 8 heads and 1 group a rank) and GPT-3
style multi-head attention (every head its own group)."""

from __future__ import annotations

import pytest

from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import compute_ops
from mpsim.workload.transformer import layer_work
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"
GPT22B = SCENARIOS / "megatron_22b_8xa100.yaml"
TOKENS, HEAD_DIM, BF16 = 8192, 128, 2


def layer(path, *overrides: str):
    scenario = load_scenario(path, list(overrides)).scenario
    return layer_work(build_workload(scenario, resolve(scenario)).context)


def named(items, name: str):
    return [op for op in compute_ops(items) if op.name == name]


def test_grouped_queries_copy_the_queries_and_v_forward_and_concatenate_the_gradients_backward():
    work = layer(LLAMA70, "training.transformer_impl=transformer_engine")
    q = TOKENS * 8 * HEAD_DIM * BF16  # 8 query heads on the rank
    k = v = TOKENS * 1 * HEAD_DIM * BF16  # its one KV group
    (forward,) = named(work.forward, "attn.qkv_split")
    assert forward.bytes == 2 * q + 2 * v  # the query's reshape and V made contiguous: read and write each
    assert forward.launches == 2
    for items in (work.backward, work.backward_input):
        (backward,) = named(items, "attn.qkv_split.grad")
        assert backward.bytes == 2 * (q + k + v)  # torch.cat of the three gradients
    assert not named(work.backward_weight, "attn.qkv_split.grad")


def test_multi_head_attention_reshapes_the_queries_as_a_view():
    # every head its own group: the query's reshape is a view, V is still strided
    scenario = load_scenario(GPT22B, ["training.transformer_impl=transformer_engine"]).scenario
    work = layer_work(build_workload(scenario, resolve(scenario)).context)
    model = scenario.model
    heads = model.num_attention_heads // scenario.parallel.tp
    head_dim = model.hidden_size // model.num_attention_heads
    v = scenario.parallel.microbatch_size * model.seq_length * heads * head_dim * BF16
    (forward,) = named(work.forward, "attn.qkv_split")
    assert forward.bytes == 2 * v and forward.launches == 1


@pytest.mark.parametrize("impl", ["local", "pytorch"])
def test_other_implementations_keep_their_own_layouts(impl):
    work = layer(LLAMA70, f"training.transformer_impl={impl}")
    assert not named(work.forward, "attn.qkv_split")
    assert not named(work.backward, "attn.qkv_split.grad")
