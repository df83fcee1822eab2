"""FSDP2's copies around its collectives, on the compute stream (mpsim/workload/stage_work.py)."""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import Op
from tests.conftest import SCENARIOS

LLAMA8 = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
FSDP = ("parallel.tp=1", "parallel.dp=64", "parallel.zero_stage=3", "parallel.sequence_parallel=false",
        "parallel.global_batch_size=64")


def stage(*overrides: str):
    s = load_scenario(LLAMA8, list(overrides)).scenario
    return s, build_workload(s, resolve(s)).stages[0]


def named(block, name: str):
    return [item for item in block.items if getattr(item, "name", "") == name]


def test_every_gather_is_followed_by_its_copy_out_and_every_scatter_preceded_by_its_copy_in():
    s, work = stage(*FSDP)
    grad_bytes = s.training.grad_bytes
    for passes in (work.forward, work.backward, work.backward_input, work.backward_weight):
        for block in passes:
            copy_out = named(block, "fsdp_all_gather_copy_out")
            copy_in = named(block, "fsdp_reduce_scatter_copy_in")
            assert len(copy_out) == (block.gather is not None)
            assert len(copy_in) == (block.release is not None)
            if block.gather is not None:
                params = block.gather.message_bytes / 2  # bf16 parameters gathered
                assert block.items[0] is copy_out[0]
                assert copy_out[0].bytes == pytest.approx(params * 4)  # read and write every gathered byte
            if block.release is not None:
                params = block.release.message_bytes / grad_bytes
                assert block.items[-1] is copy_in[0]
                assert copy_in[0].bytes == pytest.approx(params * (2 + grad_bytes))  # bf16 in, reduce dtype out


def test_twin_layers_share_one_tuple_with_the_copies():
    _, work = stage(*FSDP)
    layers = [block for block in work.forward if block.label.startswith("layer")]
    assert len(layers) > 2 and all(block.items is layers[1].items for block in layers[1:])


def test_no_copies_below_zero_3_and_the_copies_cost_time():
    _, work = stage("parallel.zero_stage=1")
    assert not any(named(block, "fsdp_all_gather_copy_out") for block in work.forward)
    s, work = stage(*FSDP)
    model = CostModel(s, resolve(s))
    ops = [item for block in work.forward for item in block.items if isinstance(item, Op)]
    copies = sum(model.compute.time(op) for op in ops if op.name.startswith("fsdp_"))
    assert copies > 0
    # the forward's compute is its ops', the copies included
    assert model.price(work.forward).compute_s == pytest.approx(sum(model.compute.time(op) for op in ops))
