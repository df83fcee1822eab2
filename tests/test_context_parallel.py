"""Context parallelism's ring (cp_comm: ring, the default) against hand-computed cases.

The model (mpsim/workload/context_parallel.py): each of the ``cp`` ranks holds ``s / cp`` tokens of
every sequence (two chunks, for the causal mask's load balance) and its queries attend over
the whole sequence; the keys and values travel round the CP group, each rank passing one
chunk of K and V to its neighbour ``cp - 1`` times while attention computes, and the backward
passes K, V and their gradients. The expected numbers below come from the model dimensions
(Llama 3 70B: 64 heads, 8 KV heads, head size 128, 8K tokens; TP 8) and the system's
datasheet link numbers, worked out here.
"""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.memory import layer_activation_bytes
from mpsim.workload.ops import Block, Overlap
from mpsim.workload.transformer import layer_work
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"  # TP 8 x PP 4 per CP rank, one 8K sequence per microbatch
SEQ, HEADS, KV_HEADS, HEAD_DIM, TP, MICROBATCH = 8192, 64, 8, 128, 8, 1
BF16 = 2


def setup(cp: int, *overrides: str):
    """(cost model, workload) of the Llama 70B scenario with ``cp`` ranks per sequence."""
    scenario = load_scenario(LLAMA70, [f"parallel.cp={cp}", f"cluster.nodes={4 * cp}", *overrides]).scenario
    layout = resolve(scenario)
    return CostModel(scenario, layout), build_workload(scenario, layout)


def layer(cp: int, *overrides: str):
    """(cost model, one layer's work on one rank)."""
    model, workload = setup(cp, *overrides)
    return model, layer_work(workload.context)


def ring_items(items) -> list[Overlap]:
    return [item for item in items if isinstance(item, Overlap) and item.comm.group == "cp"]


def flash_op(items, direction: str):
    ops = [op for item in items for op in (item.compute if isinstance(item, Overlap) else (item,))
           if op.kind == "attention" and op.direction == direction]
    assert len(ops) == 1
    return ops[0]


def kv_chunk_bytes(cp: int, tp: int = TP) -> float:
    """K and V of one rank's s / cp tokens, for the KV heads of its TP shard."""
    return MICROBATCH * (SEQ // cp) * (KV_HEADS // tp) * (HEAD_DIM + HEAD_DIM) * BF16


def network_step_s(model: CostModel, message_bytes: float) -> float:
    """One ring step between nodes: NCCL's base and per-step network latency, then the bytes at the
    sender's share of its node's NICs (8 x 400 Gb/s over 8 GPUs, at 97 %: 48.5 GB/s)."""
    system = model.system
    out = system.scale_out
    nic_share = out.nic_bandwidth * out.nics_per_node / system.devices_per_node * out.efficiency
    return system.collective_base_latency + out.step_latency + message_bytes / nic_share


def sm_share(model: CostModel) -> float:
    """Share of the SMs a running collective's kernels take (16 channels of 132 SMs on H100)."""
    return model.system.collective_channels / model.system.accelerator.compute_units


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_each_rank_computes_one_cpth_of_the_causal_attention(cp):
    _, work = layer(cp)
    # QK^T and PV over the whole sequence: 2 x 2 s^2 d FLOPs per head, for the rank's 8 heads;
    # causal: the lower triangle's s (s + 1) / 2 pairs, as the kernels' published rates count them
    full_causal = 2 * 2 * MICROBATCH * SEQ * SEQ * HEAD_DIM * (HEADS // TP) * (1 + 1 / SEQ) / 2
    forward = flash_op(work.forward, "forward")
    assert forward.flops == pytest.approx(full_causal / cp, rel=1e-12)
    # FlashAttention-2's backward: 5 matmuls to the forward's 2 (Dao 2023)
    assert flash_op(work.backward, "backward").flops == pytest.approx(2.5 * full_causal / cp, rel=1e-12)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_the_ring_passes_each_ranks_kv_chunk_cp_minus_one_times(cp):
    model, work = layer(cp)
    (forward,), (backward,) = ring_items(work.forward), ring_items(work.backward)
    # 1 x 8192/cp tokens x 1 KV head x (128 + 128) x 2 bytes: 4 MiB / cp
    assert forward.comm.message_bytes == kv_chunk_bytes(cp) == 4 * 2**20 / cp
    assert backward.comm.message_bytes == 2 * kv_chunk_bytes(cp)  # K, V and dK, dV
    # TP 8 fills a node, so the CP neighbours sit on different nodes: every step crosses the network
    assert model.collective_s(forward.comm) == pytest.approx(
        (cp - 1) * network_step_s(model, kv_chunk_bytes(cp)), rel=1e-12)
    assert model.collective_s(backward.comm) == pytest.approx(
        (cp - 1) * network_step_s(model, 2 * kv_chunk_bytes(cp)), rel=1e-12)


def exposed_cp_s(model: CostModel, items) -> float:
    """Context-parallel seconds one layer's pass leaves exposed."""
    return model.price((Block("layer", "forward", tuple(items)),)).exposed("cp")


def test_a_ring_longer_than_its_steps_is_exposed_step_by_step():
    # The ring as Transformer Engine runs it: step i computes on K/V block i while block i + 1
    # is in flight, and waits for it before step i + 1; cp steps of compute c = core / cp,
    # cp - 1 transfers of x each. cp 4 over the network: each transfer is 22.4 us of latency +
    # 1 MiB at 48.5 GB/s = 44 us, against about 17 us of core per step, and the ring's kernels
    # take 16 of the 132 SMs, which still leaves each step's compute inside its transfer. So
    # each transfer shows x - c past the compute beside it: (cp - 1)(x - c) exposed, more than
    # the whole ring less the whole core, since the last step's compute overlaps no transfer
    cp = 4
    model, work = layer(cp)
    x = network_step_s(model, kv_chunk_bytes(cp))
    c = model.compute.time(flash_op(work.forward, "forward")) / cp
    assert c <= x * (1 - sm_share(model))  # the case this test is about
    assert exposed_cp_s(model, work.forward) == pytest.approx((cp - 1) * (x - c), rel=1e-9)
    assert exposed_cp_s(model, work.forward) > (cp - 1) * x - cp * c


def test_a_ring_inside_a_node_hides_under_the_core_but_for_its_sms():
    # cp innermost with TP 4: both CP ranks of a sequence on one node, the ring on NVLink 4:
    # 450 GB/s x 0.824, NCCL's base and NVLink per-step latency; far shorter than the core,
    # which only loses the 16 of 132 SMs the ring's kernels hold while it runs
    cp, tp = 2, 4
    model, work = layer(cp, f"parallel.tp={tp}", "parallel.order=cp-tp-dp-pp", "cluster.nodes=4")
    system = model.system
    up = system.scale_up
    ring_s = (cp - 1) * (system.collective_base_latency + up.step_latency
                         + kv_chunk_bytes(cp, tp) / (up.bandwidth_per_device * up.efficiency))
    (ring,) = ring_items(work.forward)
    assert model.collective_s(ring.comm) == pytest.approx(ring_s, rel=1e-12)
    core_s = model.compute.time(flash_op(work.forward, "forward"))
    assert ring_s < core_s  # the case this test is about
    assert exposed_cp_s(model, work.forward) == pytest.approx(ring_s * sm_share(model), rel=1e-9)


def test_the_backward_ring_waits_for_each_steps_transfers():
    # the backward's step i sends K/V on and the dK/dV summed so far back, and waits for both
    # before adding its own: step 0 sends K/V, steps 1 .. cp - 2 both, the last dK/dV alone, so
    # its 2 (cp - 1) blocks of K/V or their gradient go beside cp steps of compute
    cp = 4
    model, work = layer(cp)
    (ring,) = ring_items(work.backward)
    block_s = model.collective_s(ring.comm) / (2 * (cp - 1))  # one block's share of the ring
    c = model.compute.time(flash_op(work.backward, "backward")) / cp
    f = sm_share(model)

    def side_by_side(compute_s: float, comm_s: float) -> float:
        return comm_s if compute_s <= comm_s * (1 - f) else compute_s + comm_s * f

    expected = side_by_side(c, block_s) + (cp - 2) * side_by_side(c, 2 * block_s) + side_by_side(c, block_s)
    assert exposed_cp_s(model, work.backward) == pytest.approx(expected - cp * c, rel=1e-9)


def merge_op(items, name: str):
    (op,) = [item for item in items if not isinstance(item, Overlap) and item.name == name]
    return op


def test_transformer_engines_ring_kernels_for_two_ranks():
    # Worked out from Transformer Engine 1.11's AttnFuncWithCPAndKVP2P (bf16) for cp 2, on one
    # rank's q (= its output, head size 128 for both), K/V and softmax statistics (one per token
    # and head): the forward packs K/V (2 kv), zero-fills the output (out), copies the statistics
    # to float64 and back (2 x 12 per entry), and merges each step's output (3 out, reading 12
    # bytes of statistics per entry); rank 1's second step slices the first half of the arriving
    # K/V (kv) and merges the statistics (20 per entry): 3 kv + 7 out + 68 per entry, more than
    # rank 0's (which slices half its queries and merges half an output)
    model, work = layer(2)
    tokens, heads, kv_heads = SEQ // 2, HEADS // TP, KV_HEADS // TP
    q = out = tokens * heads * HEAD_DIM * BF16
    kv = tokens * kv_heads * 2 * HEAD_DIM * BF16
    stats = tokens * heads
    assert merge_op(work.forward, "attn.cp_ring_merge").bytes == 3 * kv + 7 * out + 68 * stats
    # backward, rank 0 (the busier): K/V into the send buffer (2 kv); step 0 on half the queries
    # slices q, out and dout (q + 2 out), packs dK/dV (2 kv) and copies half of dQ (q) and all of
    # dK/dV (2 kv); the diagonal step packs dK/dV (2 kv), copies one half of dQ and adds the
    # other (2.5 q), adds one half of dK/dV and copies the other (2.5 kv)
    assert merge_op(work.backward, "attn.cp_ring_merge.grad").bytes == 10.5 * kv + 4.5 * q + 2 * out


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_the_rings_kernels_are_priced_beside_the_core(cp):
    # the kernels add their memory time to the pass: a layer's forward and backward take longer
    # than with the ring's transfers alone
    model, work = layer(cp)
    for items, name in ((work.forward, "attn.cp_ring_merge"), (work.backward, "attn.cp_ring_merge.grad")):
        op = merge_op(items, name)
        assert op.bytes > 0 and op.launches > 1
        assert model.compute.time(op) > 0


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_memory_divides_by_cp(recompute):
    # every tensor a layer keeps is per token (FlashAttention keeps no s x s scores), and a
    # rank holds s / cp tokens of each sequence
    contexts = {cp: setup(cp)[1].context for cp in (1, 2, 4, 8)}
    one = layer_activation_bytes(contexts[1], recompute)
    for cp in (2, 4, 8):
        assert layer_activation_bytes(contexts[cp], recompute) * cp == pytest.approx(one, rel=1e-12)


def test_a_pipeline_stage_keeps_one_cpth_of_the_activations():
    stages = {cp: setup(cp)[1].stages[1] for cp in (1, 4)}  # 20 of the 80 layers, no embedding or head
    assert stages[4].layer_activation_bytes * 4 == pytest.approx(stages[1].layer_activation_bytes, rel=1e-12)
