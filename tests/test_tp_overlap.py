"""Megatron-Core's --tp-comm-overlap: Transformer Engine's userbuffers overlap every
sequence-parallel collective with the GEMM beside it, piece by piece."""

from __future__ import annotations

import pytest

from mpsim.cost.actions import CostModel
from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload import build_workload
from mpsim.workload.blocks import UB_PIPELINE_SPLITS, UB_PIPELINE_SMS
from mpsim.workload.ops import Overlap, collective, gemm
from tests.conftest import SCENARIOS

LLAMA70 = SCENARIOS / "llama3_70b_32xh100.yaml"


def prepared(*overrides: str):
    scenario = load_scenario(LLAMA70, list(overrides)).scenario
    layout = resolve(scenario)
    return scenario, layout, build_workload(scenario, layout), CostModel(scenario, layout)


def overlaps(items) -> list[Overlap]:
    return [item for item in items if isinstance(item, Overlap)]


def test_the_forward_overlaps_each_gather_and_scatter_with_its_gemm():
    _, layout, workload, _ = prepared("training.tp_comm_overlap=true")
    assert layout.tp > 1 and layout.sequence_parallel
    forward = [item for block in workload.stages[1].forward for item in block.items]
    found = overlaps(forward)
    gathers = [o for o in found if o.comm.collective == "all-gather"]
    scatters = [o for o in found if o.comm.collective == "reduce-scatter"]
    # QKV and FC1 after a ring exchange in tp pieces; the output projection and FC2 before a
    # pipelined reduce-scatter, in every layer of the stage
    assert {o.compute[0].name for o in gathers} == {"attn.qkv", "mlp.fc1"}
    assert {o.compute[0].name for o in scatters} == {"attn.proj", "mlp.fc2"}
    assert all(o.chunks == layout.tp and o.comm_first for o in gathers)
    assert all(o.chunks == UB_PIPELINE_SPLITS and not o.comm_first and o.comm_sms == UB_PIPELINE_SMS
               for o in scatters)
    # no TP collective is left on its own in the forward
    assert not [item for item in forward if not isinstance(item, Overlap) and item.kind == "collective"
                and item.group == "tp"]


def test_overlap_hides_tp_communication_and_shortens_every_pass():
    _, _, plain_work, plain = prepared()
    _, _, ub_work, ub = prepared("training.tp_comm_overlap=true")
    for kind in ("forward", "backward"):
        before = plain.price(getattr(plain_work.stages[1], kind))
        after = ub.price(getattr(ub_work.stages[1], kind))
        assert after.exposed("tp") < before.exposed("tp")
        assert after.duration_s < before.duration_s
        assert after.tp_comm_s == pytest.approx(before.tp_comm_s, rel=1e-12)  # the same bytes move


def test_pipelined_pieces_follow_the_two_stage_pipeline():
    _, _, _, model = prepared()
    units = model.system.accelerator.compute_units
    op = gemm("g", 4096, 4096, 4096)
    comm = collective("c", "reduce-scatter", "tp", 1e6)
    scatter = Overlap(comm, (op,), chunks=4, comm_sms=16)
    gather = Overlap(comm, (op,), chunks=4, comm_first=True, comm_sms=0)
    slow = 1.0 / (1.0 - 16 / units)
    # nothing to communicate: the GEMM alone (at its SM margin)
    assert model.overlapped_s(1.0, 0.0, scatter) == pytest.approx(slow, rel=1e-12)
    assert model.overlapped_s(1.0, 0.0, gather) == pytest.approx(1.0, rel=1e-12)
    # nothing to compute: the collective alone
    assert model.overlapped_s(0.0, 1.0, scatter) == pytest.approx(1.0, rel=1e-12)
    assert model.overlapped_s(0.0, 1.0, gather) == pytest.approx(1.0, rel=1e-12)
    # a GEMM twice as long as its reduce-scatter hides all of it but the last piece
    assert model.overlapped_s(2.0, 1.0, scatter) == pytest.approx(2.0 * slow + 0.25, rel=1e-12)
    # a ring exchange slower than the GEMM: the first piece computes at once, then each
    # of the other three waits for its transfer
    assert model.overlapped_s(1.0, 3.0, gather) == pytest.approx(0.25 + 3.0, rel=1e-12)
    # never faster than either side, never slower than one after the other at the margin
    for compute_s, comm_s in ((0.3, 1.7), (1.0, 1.0), (2.5, 0.4)):
        for item in (scatter, gather):
            span = model.overlapped_s(compute_s, comm_s, item)
            assert max(compute_s, comm_s) <= span <= compute_s * slow + comm_s + 1e-12


def test_userbuffers_pieces_are_gemms_of_their_own(monkeypatch):
    """Transformer Engine runs an overlapped GEMM as one GEMM per piece of its rows: each piece
    fills the SMs with its own waves of tiles and reads the whole weight again."""
    _, _, _, model = prepared()
    compute = model.compute
    # Llama 3.1 70B's QKV on 4 tensor-parallel ranks, 4,096 tokens: 2,560 columns, K of 8,192
    op = gemm("attn.qkv", 4096, 2560, 8192)
    assert compute.pieces_time(op, 1) == compute.time(op)
    piece = gemm("attn.qkv", 1024, 2560, 8192)
    assert compute.pieces_time(op, 4) == pytest.approx(4 * compute.time(piece), rel=1e-12)
    # 320 tiles of 128 x 256 fill three waves of H100's 132 SMs 81 % full; four pieces of 80
    # tiles fill one wave each 61 % full
    assert compute.pieces_time(op, 4) > 1.2 * compute.time(op)
    # an overlapped pass's compute holds each overlapped GEMM as its pieces: priced as whole
    # GEMMs instead, it would be shorter by exactly the pieces' excess
    _, _, work, ub = prepared("training.tp_comm_overlap=true")
    forward = [item for block in work.stages[1].forward for item in block.items]
    extra = sum(ub.compute.pieces_time(op, o.chunks) - ub.compute.time(op)
                for o in overlaps(forward) for op in o.compute)
    assert extra > 0
    _, _, same_work, whole = prepared("training.tp_comm_overlap=true")
    monkeypatch.setattr(whole.compute, "pieces_time", lambda op, pieces: whole.compute.time(op))
    assert ub.price(work.stages[1].forward).compute_s == pytest.approx(
        whole.price(same_work.stages[1].forward).compute_s + extra, rel=1e-9)


def test_a_slow_gpus_pieces_take_as_much_longer_as_its_other_ops():
    _, _, _, model = prepared("training.tp_comm_overlap=true", "faults.slow_gpu=0@0.5")
    slow = model.on_rank(0)
    op = gemm("attn.qkv", 4096, 2560, 8192)
    assert slow.compute.pieces_time(op, 4) == pytest.approx(2 * model.on_rank(1).compute.pieces_time(op, 4))


@pytest.mark.parametrize("scale", [1.0, 2.0, 4.0])
def test_a_faster_tp_link_is_never_slower_with_overlap(scale):
    base = ("training.tp_comm_overlap=true",)
    _, _, work, model = prepared(*base)
    _, _, fast_work, fast = prepared(*base, f"cluster.system.scale_up.bandwidth_per_device={450 * scale} GB/s")
    assert fast.price(fast_work.stages[1].forward).duration_s <= model.price(work.stages[1].forward).duration_s


def test_overlap_needs_sequence_parallelism():
    with pytest.raises(InputError, match="training.tp_comm_overlap"):
        prepared("training.tp_comm_overlap=true", "parallel.sequence_parallel=false")


def test_a_recipes_userbuffers_sms_reach_each_gemm_site():
    # llama3.1_70b.yaml's ub_tp_comm_overlap_cfg (dgxc-benchmarking 35a9aec) names num_sm per site;
    # the sites it leaves out keep Transformer Engine's defaults
    tuned = "{proj_fprop: 24, qkv_dgrad: 4, qkv_wgrad: 24, fc1_dgrad: 2, fc1_wgrad: 4}"
    _, _, workload, _ = prepared("training.tp_comm_overlap=true", f"training.tp_comm_overlap_sms={tuned}")
    stage = workload.stages[1]
    forward = {o.compute[0].name: o.comm_sms for block in stage.forward for o in overlaps(block.items)}
    assert forward == {"attn.qkv": 1, "attn.proj": 24, "mlp.fc1": 1, "mlp.fc2": UB_PIPELINE_SMS}
    backward = {o.compute[0].name: o.comm_sms for block in stage.backward for o in overlaps(block.items)}
    assert backward["attn.qkv.dgrad"] == 4 and backward["attn.qkv.wgrad"] == 24
    assert backward["mlp.fc1.dgrad"] == 2 and backward["mlp.fc1.wgrad"] == 4
    assert backward["attn.proj.dgrad"] == 1 and backward["mlp.fc2.dgrad"] == 1  # ring exchanges, not named


def test_more_sms_for_the_communication_slow_the_gemm_beside_it():
    _, _, base_work, base = prepared("training.tp_comm_overlap=true")
    _, _, more_work, more = prepared("training.tp_comm_overlap=true", "training.tp_comm_overlap_sms={proj_fprop: 48}")
    assert more.price(more_work.stages[1].forward).duration_s > base.price(base_work.stages[1].forward).duration_s


@pytest.mark.parametrize("value, problem", [("{proj: 24}", "not a userbuffers GEMM site"),
                                            ("{proj_fprop: 0}", "whole number from 1")])
def test_a_userbuffers_site_is_named_and_counted_rightly(value, problem):
    with pytest.raises(InputError) as caught:
        load_scenario(LLAMA70, [f"training.tp_comm_overlap_sms={value}"])
    assert problem in str(caught.value)
