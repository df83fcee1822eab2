"""Transformer Engine's fp8 parameters: the distributed optimizer gathers 1 byte per weight."""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.cost.collectives import collective_time
from mpsim.cost.step import (FP8_PARAM_GATHER_BYTES, PARAM_GATHER_BYTES, optimizer_update_s, param_gather_bytes,
                             param_gather_s)
from mpsim.resolve import resolve
from mpsim.errors import InputError
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS

LLAMA = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"


def prepared(*overrides: str):
    scenario = load_scenario(LLAMA, ["parallel.zero_stage=1", *overrides]).scenario
    layout = resolve(scenario)
    return layout, build_workload(scenario, layout).stages, CostModel(scenario, layout)


def test_fp8_parameters_gather_one_byte_per_weight():
    _, stages, bf16 = prepared("training.dtype=fp8")
    _, _, fp8 = prepared("training.dtype=fp8", "training.fp8_params=true")
    assert param_gather_bytes(bf16) == PARAM_GATHER_BYTES == 2
    assert param_gather_bytes(fp8) == FP8_PARAM_GATHER_BYTES == 1
    works = [stages[0]]
    expected = collective_time("all-gather", stages[0].params * 1, fp8.placements["zero"], fp8.system)
    assert param_gather_s(works, fp8) == pytest.approx(expected, rel=1e-12)
    # half the bytes: faster, but not twice as fast (the collective has a latency term)
    assert param_gather_s(works, fp8) < param_gather_s(works, bf16) < 2 * param_gather_s(works, fp8)


def test_fp8_parameters_write_one_byte_less_per_owned_weight_in_the_update():
    layout, stages, bf16 = prepared("training.dtype=fp8")
    _, _, fp8 = prepared("training.dtype=fp8", "training.fp8_params=true")
    works = [stages[0]]
    owned = stages[0].params / layout.shard_ranks
    saved_s = optimizer_update_s(works, bf16) - optimizer_update_s(works, fp8)
    assert saved_s == pytest.approx(owned / bf16.compute.memory_bandwidth, rel=1e-9)


def test_fp8_parameters_need_fp8_training():
    scenario = load_scenario(LLAMA, ["training.dtype=bf16", "training.fp8_params=true"]).scenario
    with pytest.raises(InputError, match=r"training\.fp8_params.*training\.dtype: fp8"):
        resolve(scenario)
