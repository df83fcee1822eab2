"""A pass's layers priced once and replayed give the numbers pricing each layer afresh gives, to the bit."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from mpsim.cost.actions import CostModel
from mpsim.cost.segments import BlockPart, Segment, Segments
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from tests.conftest import SCENARIOS


def _afresh(work):
    """The same pass with every block's items a tuple of its own: nothing to replay."""
    return tuple(replace(block, items=tuple(list(block.items))) for block in work)


@pytest.mark.parametrize("name, overrides", [
    ("llama3_70b_32xh100", ["training.tp_comm_overlap=true"]),  # collectives overlapped with GEMMs
    ("megatron_22b_8xa100", []),  # sequence-parallel collectives in line
    ("megatron_22b_8xa100", ["training.host_sync_between_passes=true"]),  # the host paces each op
    ("megatron_22b_8xa100", ["parallel.zero_stage=3"]),  # gathers and releases around each block
])
def test_replayed_layers_price_as_layers_priced_afresh(name, overrides):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml", overrides).scenario
    layout = resolve(scenario)
    stage = max(build_workload(scenario, layout).stages, key=lambda work: len(work.forward))
    assert len(stage.forward) > 2 and len({id(block.items) for block in stage.forward}) < len(stage.forward)
    for work in (stage.forward, stage.backward, stage.backward_input, stage.backward_weight):
        replayed = CostModel(scenario, layout).price(work)
        fresh = CostModel(scenario, layout).price(_afresh(work))
        assert replayed == fresh  # every field, segments included, exactly
        assert [s.offset_s for s in replayed.segments] == [s.offset_s for s in fresh.segments]


def test_segments_are_built_once_and_behave_as_a_tuple():
    ready = Segment("dp", "dp-comm", "layer 0 gather", 0.0, 0.5)
    block = BlockPart("layer 1", "forward", (("compute", "qkv", 0, 0.0, 1.0), ("tp", "all_gather", 1, 0.0, 2.0),
                                             ("compute", "proj", 1, 0.25, 1.5)), (1.0, 2.0))
    segments = Segments([ready, block])
    expected = (ready, Segment("compute", "forward", "layer 1 qkv", 1.0, 1.0),
                Segment("tp", "tp-comm", "layer 1 all_gather", 2.0, 2.0),
                Segment("compute", "forward", "layer 1 proj", 2.25, 1.5))
    assert segments == expected and len(segments) == 4 and segments[1] == expected[1]
    assert list(segments) == list(expected) and segments.built() is segments.built()
    assert segments + (ready,) == expected + (ready,) and (ready,) + segments == (ready,) + expected
    assert pickle.loads(pickle.dumps(segments)) == expected
    assert hash(segments) == hash(expected)


@pytest.mark.parametrize("overrides", [[], ["parallel.zero_stage=3"]])
def test_replayed_layers_add_up_as_pricing_op_by_op_does(overrides):
    """With no launch cost, a pass that starts cold runs each block in place from the absolute clock,
    op after op: the replay of blocks priced once must give its numbers to the bit (a replay that
    added a block's span at once, or its totals per block, would differ in the last bits)."""
    base = ["training.host_launch_interval=0"] + overrides
    warm = load_scenario(SCENARIOS / "megatron_22b_8xa100.yaml", base).scenario
    cold = load_scenario(SCENARIOS / "megatron_22b_8xa100.yaml",
                         base + ["training.host_sync_between_passes=true"]).scenario
    layout = resolve(warm)
    stage = max(build_workload(warm, layout).stages, key=lambda work: len(work.forward))
    for work in (stage.forward, stage.backward, stage.backward_input, stage.backward_weight):
        replayed, in_place = CostModel(warm, layout).price(work), CostModel(cold, layout).price(work)
        assert (replayed.duration_s, replayed.compute_s, replayed.tp_comm_s, replayed.tp_exposed_s,
                replayed.flops, replayed.exposed_by_group) == \
               (in_place.duration_s, in_place.compute_s, in_place.tp_comm_s, in_place.tp_exposed_s,
                in_place.flops, in_place.exposed_by_group)
        assert replayed.segments == in_place.segments
