"""Where the cost model's process groups sit: ``group_placements`` against hand-placed ranks.

Every expected placement below is worked out by hand from the rank numbering (global
ranks numbered along the plan's order, innermost first; rank ``r`` on node ``r // 8``),
not read back from mpsim. A placement is (nodes the group touches, most members on one
node); both decide which links a collective runs on.
"""

from __future__ import annotations

import pytest

from mpsim.cost.groups import group_placements
from mpsim.specs.layout import Layout

DEVICES_PER_NODE = 8


def layout(*, tp: int = 1, cp: int = 1, dp: int = 1, pp: int = 1, ep: int = 1, etp: int | None = None,
           shard: int | None = None, order: str = "tp-cp-dp-pp") -> Layout:
    """A resolved layout with just the sizes the group placement reads."""
    devices = tp * cp * dp * pp
    return Layout(tp=tp, pp=pp, dp=dp, vpp=1, cp=cp, cp_comm="ring", ep=ep, etp=tp if etp is None else etp,
                  zero_stage=1, zero_shard_size=dp if shard is None else shard, microbatch_size=1,
                  global_batch_size=dp, num_microbatches=1, layers_per_chunk=(1,) * pp, devices=devices,
                  devices_per_node=DEVICES_PER_NODE, order=tuple(order.split("-")), sequence_parallel=False)


def spans(plan: Layout) -> dict[str, tuple[int, int, int]]:
    """(group size, nodes it touches, most members on one node) of every named group."""
    return {name: (p.size, p.nodes, p.per_node) for name, p in group_placements(plan).items()}


def test_default_order_keeps_tp_in_a_node_and_spreads_cp_and_dp_over_nodes():
    # 8 x 2 x 4 x 2 = 128 ranks on 16 nodes; strides: tp 1, cp 8, dp 16, pp 64
    found = spans(layout(tp=8, cp=2, dp=4, pp=2))
    assert found["tp"] == (8, 1, 8)  # ranks 0-7: node 0
    assert found["cp"] == (2, 2, 1)  # ranks 0, 8: nodes 0 and 1
    # gradients are reduced over dp x cp = 8 ranks: 0, 8, 16, ..., 56, one per node
    assert found["dp"] == (8, 8, 1)
    assert found["pp"] == (2, 2, 1)  # ranks 0, 64


def test_cp_innermost_puts_the_context_ring_on_nvlink():
    # order cp-tp-dp-pp, cp 2 x tp 4 x dp 2 = 16 ranks on 2 nodes; strides: cp 1, tp 2, dp 8
    found = spans(layout(tp=4, cp=2, dp=2, order="cp-tp-dp-pp"))
    assert found["cp"] == (2, 1, 2)  # ranks 0, 1
    assert found["tp"] == (4, 1, 4)  # ranks 0, 2, 4, 6
    assert found["dp"] == (4, 2, 2)  # ranks 0, 1 (cp) and 8, 9 (dp): two on each node


def test_dp_innermost_stretches_tp_over_nodes():
    # order dp-tp-cp-pp, dp 4 x tp 8 = 32 ranks on 4 nodes; tp stride 4: ranks 0, 4, ..., 28
    found = spans(layout(tp=8, dp=4, order="dp-tp-cp-pp"))
    assert found["tp"] == (8, 4, 2)
    assert found["dp"] == (4, 1, 4)  # ranks 0-3


def test_hybrid_sharding_keeps_the_shard_in_a_node_and_reduces_across_nodes():
    # tp 1, cp 2, dp 8, ZeRO shard of 4 DP ranks: strides cp 1, dp 2; 16 ranks on 2 nodes
    found = spans(layout(cp=2, dp=8, shard=4))
    assert found["zero"] == (8, 1, 8)  # cp {0, 1} x dp {0, 2, 4, 6}: ranks 0-7, node 0
    # one member per shard, shards 4 DP ranks (8 global ranks) apart: ranks 0 and 8
    assert found["zero-replica"] == (2, 2, 1)
    assert found["dp"] == (16, 2, 8)  # all 16 ranks


def test_hybrid_sharding_with_tp_places_each_shard_member_on_its_own_node():
    # tp 8, dp 8, shard 2: dp stride 8, so the shard is ranks 0, 8 and its replicas 0, 16, 32, 48
    found = spans(layout(tp=8, dp=8, shard=2))
    assert found["zero"] == (2, 2, 1)
    assert found["zero-replica"] == (4, 4, 1)


def test_full_sharding_spans_the_whole_data_parallel_group():
    found = spans(layout(tp=2, dp=16))  # dp stride 2: ranks 0, 2, ..., 30 on 4 nodes, 4 per node
    assert found["zero"] == found["dp"] == (16, 4, 4)
    assert found["zero-replica"] == (1, 1, 1)


def test_expert_groups_follow_megatrons_expert_layout():
    # tp 2, dp 32, ep 8, etp 1: 64 ranks on 8 nodes; expert ranks numbered etp, ep, expert-dp
    # innermost first, so ep stride 1 and expert-dp stride 8; 64 / (8 x 1) = 8 replicas
    found = spans(layout(tp=2, dp=32, ep=8, etp=1))
    assert found["etp"] == (1, 1, 1)
    assert found["ep"] == (8, 1, 8)  # ranks 0-7: the token all-to-all stays on NVLink
    assert found["edp"] == (8, 8, 1)  # ranks 0, 8, ..., 56


def test_expert_tensor_parallelism_pushes_the_expert_group_across_nodes():
    # Mixtral's layout: tp 2, ep 8, etp = tp = 2; ep stride 2: ranks 0, 2, ..., 14 on 2 nodes;
    # expert-dp stride 16, 64 / 16 = 4 replicas: ranks 0, 16, 32, 48
    found = spans(layout(tp=2, dp=32, ep=8))
    assert found["etp"] == (2, 1, 2)
    assert found["ep"] == (8, 2, 4)
    assert found["edp"] == (4, 4, 1)


def test_expert_replicas_stride_over_a_whole_expert_parallel_group():
    # tp 2, dp 8, ep 2, etp 2: 16 ranks on 2 nodes; an expert-parallel group covers etp x ep = 4
    # ranks, so the 16 / 4 = 4 replicas of an expert shard are ranks 0, 4, 8, 12: two per node
    found = spans(layout(tp=2, dp=8, ep=2))
    assert found["ep"] == (2, 1, 2)  # ranks 0, 2
    assert found["edp"] == (4, 2, 2)


@pytest.mark.parametrize("order,tp_nodes", [("tp-cp-dp-pp", 1), ("cp-tp-dp-pp", 2), ("dp-cp-tp-pp", 8)])
def test_a_group_of_eight_covers_one_node_only_when_it_is_innermost(order, tp_nodes):
    # tp 8 x cp 2 x dp 4: tp stride 1, 2 (after cp) or 8 (after dp x cp)
    placement = group_placements(layout(tp=8, cp=2, dp=4, order=order))["tp"]
    assert placement.nodes == tp_nodes
    assert placement.per_node == DEVICES_PER_NODE // tp_nodes


def test_folded_expert_groups_take_in_the_tensor_parallel_ranks():
    # Megatron-Core's parallel folding: TP 2 x DP 16 with ETP 1 lays EP 32 over all 32 ranks of a
    # stage, ranks 0-31 on nodes 0-3, where an EP group within DP alone could hold 16 at most
    found = spans(layout(tp=2, dp=16, pp=8, ep=32, etp=1))
    assert found["ep"] == (32, 4, 8)
    assert found["etp"] == (1, 1, 1)
    assert found["edp"] == (1, 1, 1)  # each expert on one rank of the stage
    assert found["tp"] == (2, 1, 2)


def test_scenarios_fold_expert_parallelism_as_megatron_core_allows():
    from mpsim.errors import InputError
    from mpsim.specs import load_scenario
    from mpsim.specs.layout import resolve_layout
    from tests.conftest import SCENARIOS

    mixtral = SCENARIOS / "mixtral_8x7b_64xh100.yaml"
    base = ["cluster.nodes=1", "parallel.tp=2", "parallel.global_batch_size=8"]
    folded = resolve_layout(load_scenario(mixtral, [*base, "parallel.ep=8", "parallel.etp=1"]).scenario)
    assert (folded.dp, folded.ep, folded.etp, folded.expert_dp) == (4, 8, 1, 1)
    # without folding an expert split over both TP ranks leaves 4 groups of 2 for the 8 experts
    with pytest.raises(InputError, match="lower parallel.etp") as raised:
        resolve_layout(load_scenario(mixtral, [*base, "parallel.ep=8"]).scenario)
    assert raised.value.field == "parallel.ep"
