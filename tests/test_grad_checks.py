"""The checks on the gradients before the update: the global norm for clipping, fp16's inf/nan check."""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.cost.collectives import collective_time
from mpsim.cost.step import (GRAD_STAT_BYTES, UNSCALE_BYTES_PER_PARAM, grad_checks_s, grad_stats_placement,
                             optimizer_s)
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS

GPT3 = SCENARIOS / "gpt3_175b_64xa100.yaml"


def prepared(*overrides: str):
    scenario = load_scenario(GPT3, list(overrides)).scenario
    layout = resolve(scenario)
    return layout, build_workload(scenario, layout).stages, CostModel(scenario, layout)


def test_the_norm_is_reduced_over_every_rank_holding_distinct_gradients():
    layout, _, model = prepared("training.distributed_optimizer=false", "parallel.zero_stage=0")
    assert grad_stats_placement(model).size == layout.tp * layout.pp
    layout, _, model = prepared("parallel.zero_stage=1")
    assert grad_stats_placement(model).size == layout.tp * layout.pp * layout.cp * layout.zero_shard_size


def test_clipping_costs_one_all_reduce_of_one_number():
    _, stages, model = prepared()
    _, _, unclipped = prepared("training.clip_grad=false")
    works = [stages[0]]
    allreduce = collective_time("all-reduce", GRAD_STAT_BYTES, grad_stats_placement(model), model.system)
    assert allreduce > 0
    assert grad_checks_s(works, model) == pytest.approx(allreduce, rel=1e-12)
    assert grad_checks_s(works, unclipped) == 0.0
    assert optimizer_s(works, model) - optimizer_s(works, unclipped) == pytest.approx(allreduce, rel=1e-9)


def test_fp16_adds_the_unscale_of_the_owned_gradients_and_a_second_all_reduce():
    layout, stages, model = prepared("training.dtype=fp16", "parallel.zero_stage=1")
    works = [stages[0]]
    allreduce = collective_time("all-reduce", GRAD_STAT_BYTES, grad_stats_placement(model), model.system)
    owned = stages[0].params / layout.shard_ranks
    expected = 2 * allreduce + owned * UNSCALE_BYTES_PER_PARAM / model.compute.memory_bandwidth
    assert grad_checks_s(works, model) == pytest.approx(expected, rel=1e-12)
