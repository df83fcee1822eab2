"""A deduplicating MoE dispatcher (DeepEP) and group-limited routing (``mpsim/cost/dispatch.py``):
the copies a token costs, held to exact expectations and to DeepEP's published bandwidths."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.cost.dispatch import token_spread
from mpsim.workload.ops import Routing
from tests.conftest import SCENARIOS, benchmark_error_line, load_benchmark

DEEPSEEK = SCENARIOS / "deepseek_v3_2048xh100.yaml"  # EP 64 over 8 nodes, 256 experts, top 8 of 4 groups
MIXTRAL = SCENARIOS / "mixtral_8x7b_64xh100.yaml"
DEEPEP = "training.moe_token_dispatcher=deepep"
# the DeepSeek scenario runs DeepEP with an fp8 dispatch; these take it back step by step
ALLTOALL = ("training.moe_token_dispatcher=alltoall", "training.moe_dispatch_fp8=false")
DEEPEP_BF16 = (DEEPEP, "training.moe_dispatch_fp8=false")
NO_GROUPS = ("model.moe.router_groups=null", "model.moe.router_group_topk=null")


def run(path, *overrides: str):
    scenario = load_scenario(path, list(overrides)).scenario
    return summarize(simulate(scenario))


def test_one_node_sends_each_token_to_the_other_gpus_it_reaches():
    # top 2 of 8 experts, one per GPU of a node: 2 GPUs, the sender itself one time in four
    spread = token_spread(Routing(8, 2), 8, 8)
    assert spread.network == 0.0
    assert spread.nvlink == pytest.approx(2 - 2 / 8, rel=0.02)


def test_without_groups_the_nodes_reached_follow_uniform_picks():
    # 8 of 256 experts drawn at random: a node of 32 is missed with probability C(224, 8) / C(256, 8);
    # each of the 7 other nodes is reached with the complement
    spread = token_spread(Routing(256, 8), 64, 8)
    missed = math.comb(224, 8) / math.comb(256, 8)
    assert spread.network == pytest.approx(7 * (1 - missed), rel=0.02)


def test_group_limited_routing_reaches_at_most_its_groups():
    # DeepSeek-V3: 8 groups (one per node), 4 picked; a picked group scores its best two experts,
    # so nearly every picked group receives one: about 4 nodes, 7 of 8 of them remote
    limited = token_spread(Routing(256, 8, 8, 4), 64, 8)
    free = token_spread(Routing(256, 8), 64, 8)
    assert 3.3 <= limited.network <= 3.5
    assert limited.network < free.network


@settings(max_examples=30, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8]), per_node=st.sampled_from([2, 4, 8]),
       top_k=st.sampled_from([1, 2, 4, 8]), picked=st.sampled_from([1, 2, 4]))
def test_copies_are_bounded_by_the_experts_and_the_groups(nodes, per_node, top_k, picked):
    ranks = nodes * per_node
    experts = 4 * ranks
    groups = max(nodes, 2)
    picked = min(picked, groups)
    if top_k > picked * (experts // groups):
        return
    spread = token_spread(Routing(experts, top_k, groups, picked), ranks, per_node)
    fewer = token_spread(Routing(experts, top_k, groups, 1), ranks, per_node) if top_k <= experts // groups else None
    assert 0 <= spread.network <= min(top_k, nodes - 1, picked * max(1, nodes // groups)) + 1e-9
    assert 0 <= spread.nvlink <= top_k
    if fewer is not None:
        # a token held to one group reaches no more nodes than one held to several
        assert fewer.network <= spread.network + 1e-9


# mean absolute error (percent) of benchmarks/deepep_dispatch.py's eight rows when the dispatcher
# was added (docs/accuracy.md); a regression guard: the test fails when it grows a point past it
DOCUMENTED_DEEPEP_MEAN_ABS_ERROR_PCT = 14.67


def test_deepep_published_bandwidths(capsys):
    module = load_benchmark("deepep_dispatch")
    last, mean_abs = benchmark_error_line(module, capsys)
    assert last.startswith("rows=8 ")
    assert mean_abs <= DOCUMENTED_DEEPEP_MEAN_ABS_ERROR_PCT + 1.0
    # where the network sets the time (EP 32 and 64 over 4 and 8 nodes) the dispatch is within
    # 15 % of DeepEP's published runs (58 and 51 GB/s of RDMA); in sample for the one choice made
    # after reading them, the network at its peak rate (docs/accuracy.md)
    for ranks, published in ((32, 58.0), (64, 51.0)):
        gbps, fabric = module.predicted_gbps(ranks, module.FP8_TOKEN_BYTES)
        assert fabric == "RDMA"
        assert gbps == pytest.approx(published, rel=0.15)


# mean absolute error (percent) of benchmarks/moe_layer.py's twelve rows (NVIDIA's moe_perf CI timings
# of one MoELayer on H100) when the check was added (docs/accuracy.md); a regression guard
DOCUMENTED_MOE_LAYER_MEAN_ABS_ERROR_PCT = 7.05


def test_moe_layer_against_nvidias_ci_timings(capsys):
    module = load_benchmark("moe_layer")
    last, mean_abs = benchmark_error_line(module, capsys)
    assert last.startswith("rows=12 ")
    assert mean_abs <= DOCUMENTED_MOE_LAYER_MEAN_ABS_ERROR_PCT + 1.0
    # as measured (7.12 and 5.68 ms), the alltoall dispatcher's DeepSeek-proxy forward is the
    # slower: it sends a copy per expert, DeepEP one per GPU
    alltoall, deepep = module.layer_ms("deepseek", "a2a"), module.layer_ms("deepseek", "deepep")
    assert alltoall[0] > deepep[0] and alltoall[1] > deepep[1]
    # the proxies' experts are TransformerConfig's default, one GeLU projection: priced gated (as
    # Mixtral's SwiGLU) the Mixtral forward would take half as long again
    gated = module.layer_ms("mixtral", "a2a", ("model.ffn_type=swiglu",))
    assert gated[0] > 1.3 * module.layer_ms("mixtral", "a2a")[0]


def test_deepep_shortens_the_deepseek_step_and_fp8_dispatch_more():
    plain = run(DEEPSEEK, *ALLTOALL)
    deduplicated = run(DEEPSEEK, *DEEPEP_BF16)
    fp8 = run(DEEPSEEK)
    assert deduplicated.exposed_ep_comm_s < plain.exposed_ep_comm_s
    assert deduplicated.step_time_s < plain.step_time_s
    assert fp8.step_time_s < deduplicated.step_time_s


def test_the_plain_all_to_all_ignores_the_groups():
    # Megatron's alltoall dispatcher sends a copy per expert wherever the experts are
    assert run(DEEPSEEK, *ALLTOALL).step_time_s == run(DEEPSEEK, *ALLTOALL, *NO_GROUPS).step_time_s
    assert run(DEEPSEEK, *DEEPEP_BF16).step_time_s < run(DEEPSEEK, *DEEPEP_BF16, *NO_GROUPS).step_time_s


@pytest.mark.parametrize("overrides,field", [
    (("training.moe_dispatch_fp8=true",), "training.moe_dispatch_fp8"),
    ((DEEPEP, "cluster.system=tpu-v5p-8x8x8"), "training.moe_token_dispatcher"),
])
def test_impossible_dispatch_settings_name_the_field(overrides, field):
    with pytest.raises(InputError) as error:
        resolve(load_scenario(MIXTRAL, list(overrides)).scenario)
    assert error.value.field == field


def test_deepep_on_a_dense_model_is_one_line_and_exit_code_2():
    done = subprocess.run([sys.executable, "-m", "mpsim", "run", str(SCENARIOS / "llama3_8b_64xh100_dp8.yaml"),
                           "--set", DEEPEP], capture_output=True, text=True)
    assert done.returncode == 2
    assert "training.moe_token_dispatcher" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("moe,message", [
    ({"router_groups": 8}, "go together"),
    ({"router_groups": 7, "router_group_topk": 2}, "does not divide num_experts"),
    ({"router_groups": 8, "router_group_topk": 9}, "larger than router_groups"),
])
def test_bad_group_limits_are_refused(moe, message):
    overrides = [*NO_GROUPS, *(f"model.moe.{key}={value}" for key, value in moe.items())]
    with pytest.raises(InputError, match=message):
        load_scenario(DEEPSEEK, overrides)


def test_a_deepseek_config_brings_its_group_limits(tmp_path):
    # DeepSeek-V3's Hugging Face config.json (the routing and shape fields mpsim reads)
    config = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
              "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
              "max_position_embeddings": 4096, "n_routed_experts": 256, "num_experts_per_tok": 8,
              "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3, "n_group": 8,
              "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6, "hidden_act": "silu"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    moe = load_scenario(DEEPSEEK, [f"model=hf:{path}"]).scenario.model.moe
    assert (moe.router_groups, moe.router_group_topk) == (8, 4)
    # DeepSeek-V2-Lite's one group is no limit
    path.write_text(json.dumps({**config, "n_group": 1, "topk_group": 1}))
    moe = load_scenario(DEEPSEEK, [f"model=hf:{path}"]).scenario.model.moe
    assert (moe.router_groups, moe.router_group_topk) == (None, None)


def test_a_paired_step_computes_on_the_sms_its_hidden_communication_leaves():
    from mpsim.cost.actions import ActionCost
    from mpsim.cost.pairs import overlapped_cost
    # 2 s of EP all-to-all exposed by the forward, hidden under the pair's 6 s of compute, whose
    # kernels hold a quarter of the SMs meanwhile: the compute loses a quarter of 2 s
    forward = ActionCost(4.0, 2.0, 2.0, 2.0, 0.0, (), exposed_by_group=(("ep", 2.0),))
    backward = ActionCost(4.0, 4.0, 0.0, 0.0, 0.0, ())
    shares = {"ep": 0.25}
    assert overlapped_cost(forward, backward, sm_share=shares.get).duration_s == pytest.approx(6.0 + 0.5)
    assert overlapped_cost(forward, backward).duration_s == pytest.approx(6.0)  # no SMs held: as before
    assert overlapped_cost(forward, backward, overlap=False, sm_share=shares.get).duration_s == 8.0


def test_deepep_sms_slow_the_compute_they_overlap():
    few = run(DEEPSEEK, "training.moe_dispatch_sms=2")
    many = run(DEEPSEEK, "training.moe_dispatch_sms=40")
    assert few.step_time_s < run(DEEPSEEK).step_time_s < many.step_time_s
    # without the paired overlap nothing computes beside the all-to-alls
    apart = ("training.overlap_paired_passes=false",)
    assert run(DEEPSEEK, *apart, "training.moe_dispatch_sms=2").step_time_s == \
        run(DEEPSEEK, *apart, "training.moe_dispatch_sms=40").step_time_s


def test_one_expert_rank_sends_nothing():
    # EP 1 holds every expert: the deduplicating dispatch costs what the plain one does, nothing
    one = ("parallel.ep=1", "parallel.tp=1", "parallel.sequence_parallel=false", "cluster.nodes=1",
           "parallel.global_batch_size=64")
    assert run(MIXTRAL, *one, DEEPEP).exposed_ep_comm_s == run(MIXTRAL, *one).exposed_ep_comm_s == 0.0


@settings(max_examples=40, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8]), per_node=st.sampled_from([4, 8]),
       intra=st.floats(1.5, 4.0), inter=st.floats(1.5, 4.0), fp8=st.booleans(), limited=st.booleans())
def test_a_faster_fabric_or_smaller_message_is_never_slower(nodes, per_node, intra, inter, fp8, limited):
    import dataclasses

    from mpsim.cost.collectives import gpu_group
    from mpsim.cost.dispatch import deduplicated_all_to_all_s
    from mpsim.cost.topology import GroupPlacement
    from mpsim.specs.catalog import load_system
    from mpsim.workload.ops import collective
    group = gpu_group(GroupPlacement(nodes * per_node, nodes, per_node), load_system("dgx-h100"))
    routing = Routing(256, 8, 8, 4) if limited else Routing(256, 8)
    token_bytes = 7168 + 4 * 56 if fp8 else 2 * 7168
    op = collective("dispatch", "all-to-all", "ep", 4096 * 8 * token_bytes, routing)
    base = deduplicated_all_to_all_s(op, group)
    faster = dataclasses.replace(group, intra=dataclasses.replace(group.intra, bandwidth=group.intra.bandwidth * intra),
                                 inter=dataclasses.replace(group.inter, bandwidth=group.inter.bandwidth * inter))
    assert deduplicated_all_to_all_s(op, faster) <= base
    smaller = dataclasses.replace(op, message_bytes=op.message_bytes / 2)
    assert deduplicated_all_to_all_s(smaller, group) <= base
    # one copy per node and GPU never moves more over the network than a copy per expert does
    plain_network_bytes = op.message_bytes * (nodes - 1) * per_node / (nodes * per_node)
    spread = token_spread(routing, nodes * per_node, per_node)
    assert spread.network * op.message_bytes / 8 <= plain_network_bytes + 1e-6
