"""The host's wait in every MoE layer's forward (``mpsim/workload/moe.py``, ``host_sync``) and
how the pass is priced after it (``mpsim/cost/actions.py``, ``_Host``): where each framework
waits, exact times on a pass of known kernels, and padding to capacity, which removes it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.cost.actions import CostModel
from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload.embedding import padded_vocab
from mpsim.workload.ops import Block, memory_op
from mpsim.workload.stages import build_stage, layer_context, stage_options
from tests.conftest import SCENARIOS

MIXTRAL = SCENARIOS / "mixtral_8x7b_64xh100.yaml"  # TP 2, EP 8, alltoall, Megatron's layers
# a fine-grained MoE on one node per 8 ranks: 128 experts of 768, 8 local, fp8 Transformer Engine
QWEN3 = ("model=qwen3-30b-a3b", "cluster.nodes=2", "parallel.tp=1", "parallel.sequence_parallel=false",
         "parallel.recompute=none", "parallel.ep=16", "parallel.global_batch_size=1024", "training.dtype=fp8",
         "training.transformer_impl=transformer_engine")


def one_layer(*overrides: str):
    """One MoE layer's stage work and the cost model that prices it."""
    scenario = load_scenario(MIXTRAL, list(overrides)).scenario
    layout = resolve(scenario)
    ctx = layer_context(scenario, layout)
    options = stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp))
    return build_stage(ctx, 1, 0, False, False, options), CostModel(scenario, layout)


def waits(work) -> list[tuple[str, str]]:
    """(op, "start" or "end") for each op the host waits for in ``work``."""
    return [(item.name, item.host_waits) for block in work for item in block.items
            if getattr(item, "host_waits", "")]


@pytest.mark.parametrize("overrides,waited_for", [
    # Megatron-Core's alltoall dispatcher with EP > 1: the counts are copied as permutation 1
    # begins and read before the all-to-all, the permutation launched: the host waits for its start
    ((), [("moe.permute", "start")]),
    # one expert rank, no expert TP: read when the dispatch returns, after the permutation
    (("parallel.ep=1", "parallel.tp=1", "parallel.sequence_parallel=false", "cluster.nodes=1"),
     [("moe.permute", "end")]),
    # a capacity that drops tokens: the output size is read before permutation 1, with EP > 1 too
    (("model.moe.capacity_factor=1.25",), [("moe.topk", "end")]),
    # DeepEP: the notify kernel at the dispatch's start writes the counts the host spins on, and
    # Megatron-Core's flex dispatcher then reads a count back when it maps the received indices
    # with boolean masks: the host waits for the dispatch's end
    (("training.moe_token_dispatcher=deepep",), [("moe.dispatch_all_to_all", "end")]),
    (("training.moe_token_dispatcher=deepep", "training.transformer_impl=pytorch", "parallel.tp=1",
      "parallel.sequence_parallel=false"), [("moe.permute", "end")]),
    # HybridEP: the experts read its counts from the GPU (TEGroupedMLP's .tolist()) after its dispatch
    (("training.moe_token_dispatcher=hybridep",), [("moe.dispatch_all_to_all", "end")]),
    # plain PyTorch (torchtitan): split sizes to the host before the tokens' all-to-all, EP > 1 only
    (("training.transformer_impl=pytorch", "parallel.tp=1", "parallel.sequence_parallel=false"),
     [("moe.permute", "end")]),
    (("training.transformer_impl=pytorch", "parallel.tp=1", "parallel.sequence_parallel=false", "parallel.ep=1"),
     []),
    # padded to capacity: the sizes are fixed, nothing is read
    (("model.moe.capacity_factor=1.25", "training.moe_pad_to_capacity=true"), []),
])
def test_the_host_waits_once_per_layer_forward_where_the_framework_reads_the_counts(overrides, waited_for):
    work, _ = one_layer(*overrides)
    assert waits(work.forward) == waited_for
    # the backward's all-to-alls reuse the forward's sizes
    assert waits(work.backward) == waits(work.backward_input) == waits(work.backward_weight) == []


def test_the_host_paces_the_kernels_after_the_one_it_waits_for():
    launch_s = 50e-6
    _, model = one_layer(f"training.host_launch_interval={launch_s}")
    long_op = memory_op("long", 4e9)  # milliseconds
    middle = memory_op("middle", 1.2e9)  # a few launches long
    short = memory_op("short", 1e6)  # well under one launch
    tail = memory_op("tail", 2e6)
    long_s, middle_s, short_s, tail_s = (model.compute.time(op) for op in (long_op, middle, short, tail))
    assert short_s < launch_s and 3 * launch_s < middle_s < long_s

    def priced(*ops):
        return model.price((Block("layer 0", "forward", ops),))

    # the host ran ahead: the kernels back to back
    ahead = priced(long_op, short, tail)
    assert ahead.duration_s == pytest.approx(long_s + short_s + tail_s, rel=1e-12)
    assert ahead.host_wait_s == 0.0
    # it waits for the long kernel's end: the short one starts a launch after it, the tail a
    # launch after that, the short one having ended before
    waited = priced(replace(long_op, host_waits="end"), short, tail)
    assert waited.duration_s == pytest.approx(long_s + 2 * launch_s + tail_s, rel=1e-12)
    assert waited.host_wait_s == pytest.approx(2 * launch_s - short_s, rel=1e-12)
    # it launched the middle kernel and waits for the GPU to start it: the next launches go on
    # while it runs, and nothing idles
    started = priced(long_op, replace(middle, host_waits="start"), short, tail)
    assert started.duration_s == pytest.approx(long_s + middle_s + short_s + tail_s, rel=1e-12)
    assert started.host_wait_s == 0.0
    # waiting for its end instead, the two short kernels after it wait for their launches
    ended = priced(long_op, replace(middle, host_waits="end"), short, tail)
    assert ended.duration_s == pytest.approx(long_s + middle_s + 2 * launch_s + tail_s, rel=1e-12)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([0.0, 5e-6, 29e-6, 80e-6, 200e-6]),
       st.sampled_from([(), ("training.moe_token_dispatcher=deepep",)]))
def test_a_wait_never_speeds_a_pass_and_costs_nothing_with_an_instant_host(launch_s, dispatcher):
    work, model = one_layer(*QWEN3, *dispatcher, f"training.host_launch_interval={launch_s}")
    unflagged = tuple(replace(block, items=tuple(replace(item, host_waits="") if hasattr(item, "host_waits")
                                                 else item for item in block.items)) for block in work.forward)
    waited, free = model.price(work.forward), model.price(unflagged)
    assert waited.duration_s >= free.duration_s - 1e-15
    if launch_s == 0.0:
        assert waited.duration_s == pytest.approx(free.duration_s, rel=1e-12)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([5e-6, 29e-6, 80e-6]), st.sampled_from([1.5, 2.0]))
def test_a_slower_host_never_makes_the_waiting_forward_faster(launch_s, slower):
    times = [one_layer(*QWEN3, f"training.host_launch_interval={s}")[1] for s in (launch_s, launch_s * slower)]
    work, _ = one_layer(*QWEN3)
    fast, slow = (model.price(work.forward).duration_s for model in times)
    assert slow >= fast


def test_padding_to_capacity_carries_the_capacity_and_drops_the_wait():
    capacity = 1.25
    dropped, _ = one_layer(f"model.moe.capacity_factor={capacity}", "model.moe.load_imbalance=1.0")
    padded, _ = one_layer(f"model.moe.capacity_factor={capacity}", "model.moe.load_imbalance=1.0",
                          "training.moe_pad_to_capacity=true")

    def expert_rows(work):
        fc1 = next(item for block in work.forward for item in block.items
                   if getattr(item, "name", "").startswith("moe.experts.fc1"))
        return fc1.shape[1]

    def dispatch_bytes(work):
        return next(item.message_bytes for block in work.forward for item in block.items
                    if getattr(item, "name", "") == "moe.dispatch_all_to_all")

    # the busiest rank's share, 1.0 of the mean when tokens are dropped at an even load, is the
    # full capacity on every rank when padded
    assert expert_rows(padded) == math.ceil(expert_rows(dropped) * capacity)
    assert dispatch_bytes(padded) == pytest.approx(dispatch_bytes(dropped) * capacity, rel=1e-12)
    assert waits(dropped.forward) == [("moe.topk", "end")] and waits(padded.forward) == []


@pytest.mark.parametrize("overrides", [
    ("training.moe_pad_to_capacity=true",),  # no capacity to pad to
    ("model.moe.capacity_factor=1.25", "training.moe_pad_to_capacity=true", "training.moe_token_dispatcher=deepep"),
    ("model.moe.capacity_factor=1.25", "training.moe_pad_to_capacity=true", "training.transformer_impl=pytorch",
     "parallel.tp=1", "parallel.sequence_parallel=false"),
])
def test_padding_where_no_framework_pads_is_refused(overrides):
    with pytest.raises(InputError) as error:
        resolve(load_scenario(MIXTRAL, list(overrides)).scenario)
    assert error.value.field == "training.moe_pad_to_capacity"
