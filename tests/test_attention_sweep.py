"""Fused attention priced from the kernel's published sweep over sequence lengths.

The H100 files carry cuDNN's fused-attention throughput from the FlashAttention-3 paper's
benchmark (docs/hardware-sources.md, FA3-SWEEP). A kernel call is priced at the rate
measured for the keys per query it sees, its masked and unmasked FLOPs apart; a context-
parallel ring makes ``cp`` calls over ``s / cp`` keys, one of them masked.
"""

from __future__ import annotations

import math

import pytest

from mpsim.cost.compute import ComputeModel
from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.accelerator import AttentionSweepSpec
from mpsim.specs.catalog import load_accelerator
from mpsim.workload.attention import _kernel_calls, flash_backward_flops
from mpsim.workload import build_workload
from mpsim.workload.ops import Op, compute_ops
from mpsim.workload.stages import layer_context
from tests.conftest import SCENARIOS

H100 = load_accelerator("h100-sxm-80gb")
SWEEP = H100.efficiency.attention_sweep
TFLOPS = 1e12


def _attention(flops: float, seq: int, causal_share: float, direction: str = "forward") -> Op:
    return Op("attn.flash", "attention", flops=flops, direction=direction, kernel_seq=seq, causal_share=causal_share)


def _compute_s(op: Op, dtype: str = "bf16", part=H100) -> float:
    """Compute seconds at the sweep's own conditions: a short benchmark, so times the share of
    the burst rate the GPU holds at its power limit (tests/test_compute_model.py checks that share)."""
    model = ComputeModel(part, dtype)
    burst_s = model.time(op) - part.efficiency.kernel_overhead  # bytes are 0: the compute side alone
    return burst_s * (part.efficiency.sustained_attention or part.efficiency.sustained_compute)


def _refused(tmp_path, file: str, old: str, new: str, match: str) -> None:
    """The shipped accelerator ``file`` with ``old`` replaced by ``new`` fails to load with ``match``."""
    text = (SCENARIOS.parent / "hardware" / "accelerators" / file).read_text()
    assert old in text
    bad = tmp_path / file
    bad.write_text(text.replace(old, new))
    with pytest.raises((ValueError, InputError), match=match):
        load_accelerator(str(bad))


def test_at_a_measured_length_the_rate_is_the_published_one():
    # FA3-SWEEP, cuDNN at 4k: forward 609 unmasked, 518 causal; backward 499 unmasked
    flops = 1e12
    assert _compute_s(_attention(flops, 4096, 0.0)) == pytest.approx(flops / (609 * TFLOPS), rel=1e-12)
    assert _compute_s(_attention(flops, 4096, 1.0)) == pytest.approx(flops / (518 * TFLOPS), rel=1e-12)
    assert _compute_s(_attention(flops, 4096, 0.0, "backward")) == pytest.approx(flops / (499 * TFLOPS), rel=1e-12)


def test_between_lengths_the_rate_is_interpolated_in_log_length():
    # 2896 ~ 2^11.5: halfway between 2k (484) and 4k (518) for the causal forward
    assert SWEEP.rate(2896, backward=False, causal=True) == pytest.approx((484 + 518) / 2 * TFLOPS, rel=2e-3)
    assert SWEEP.rate(256, backward=False, causal=True) == SWEEP.rate(512, backward=False, causal=True)
    assert SWEEP.rate(1 << 20, backward=True, causal=False) == SWEEP.rate(16384, backward=True, causal=False)


def test_the_causal_backward_takes_the_forward_mask_ratio():
    for seq in SWEEP.seq_lengths:
        ratio = SWEEP.rate(seq, False, True) / SWEEP.rate(seq, False, False)
        assert SWEEP.rate(seq, True, True) == pytest.approx(SWEEP.rate(seq, True, False) * ratio, rel=1e-12)


def test_short_sequences_and_causal_masks_cost_more_per_flop():
    flops = 1e12
    assert _compute_s(_attention(flops, 512, 1.0)) > 1.5 * _compute_s(_attention(flops, 8192, 1.0))
    for seq in (512, 2048, 8192):
        assert _compute_s(_attention(flops, seq, 1.0)) > _compute_s(_attention(flops, seq, 0.0))
        assert _compute_s(_attention(flops, seq, 1.0, "backward")) > _compute_s(_attention(flops, seq, 0.0, "backward"))


def test_masked_and_unmasked_shares_are_priced_apart():
    flops = 1e12
    mixed = _compute_s(_attention(flops, 4096, 0.25))
    expected = 0.25 * flops / (518 * TFLOPS) + 0.75 * flops / (609 * TFLOPS)
    assert mixed == pytest.approx(expected, rel=1e-12)


def test_unknown_lengths_use_the_single_fraction_and_unmeasured_fp8_runs_as_bf16():
    flops = 1e12
    assert _compute_s(_attention(flops, 0, 1.0)) == pytest.approx(
        flops / (H100.peak("bf16") * H100.efficiency.attention_forward), rel=1e-12)
    # fp8 inputs run at the kernel's fp8 series (the H100's, inferred from the H200's runs on the same chip);
    # at an unknown length, at the single bf16 fraction
    assert _compute_s(_attention(flops, 4096, 1.0), "fp8") == pytest.approx(flops / (748.5 * TFLOPS), rel=1e-12)
    assert _compute_s(_attention(flops, 0, 1.0), "fp8") == _compute_s(_attention(flops, 0, 1.0))
    # a kernel without an fp8 series (MI300X's AITER sweep): fp8 inputs at the bf16 sweep's rate
    mi300x = load_accelerator("mi300x")
    assert _compute_s(_attention(flops, 4096, 1.0), "fp8", mi300x) == pytest.approx(flops / (509 * TFLOPS), rel=1e-12)


@pytest.mark.parametrize("cp_comm, cp, seq, share, half_keys", [
    ("ring", 1, 8192, 1.0, 0), ("ring", 2, 4096, 0.5, 2048), ("ring", 4, 2048, 0.25, 1024),
    ("all-gather", 4, 8192, 1.0, 0), ("all-to-all", 4, 8192, 1.0, 0),
])
def test_a_context_parallel_ring_calls_the_kernel_on_blocks_of_s_over_cp(cp_comm, cp, seq, share, half_keys):
    overrides = ["model.seq_length=8192", f"parallel.cp={cp}", f"parallel.cp_comm={cp_comm}", "parallel.tp=8",
                 "parallel.pp=1", f"parallel.dp={8 // cp}"]
    scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml", overrides).scenario
    assert _kernel_calls(layer_context(scenario, resolve(scenario))) == (seq, share, half_keys)


def test_a_rings_unmasked_calls_go_at_the_slower_of_its_ranks_lengths():
    # a ring of two over 8k tokens: rank 0's unmasked call sees half the queries against 4k keys,
    # rank 1's all its queries against 2k; the ranks meet at each step, so the slower sets the pace
    def ring(direction: str) -> float:
        op = Op("attn.flash", "attention", flops=1e12, direction=direction, kernel_seq=4096, causal_share=0.5,
                unmasked_seq=2048)
        return _compute_s(op)

    # H100 cuDNN: backward 465 at 2k and 499 at 4k unmasked (2k the slower); forward 617 and 609 (4k)
    assert ring("backward") == pytest.approx(0.5e12 / SWEEP.rate(4096, True, True) + 0.5e12 / (465 * TFLOPS), rel=1e-12)
    assert ring("forward") == pytest.approx(0.5e12 / (518 * TFLOPS) + 0.5e12 / (609 * TFLOPS), rel=1e-12)
    # the masked call is the rank's own diagonal block at s / cp keys: it takes no part
    causal_only = Op("attn.flash", "attention", flops=1e12, direction="forward", kernel_seq=4096, causal_share=1.0,
                     unmasked_seq=2048)
    assert _compute_s(causal_only) == pytest.approx(1e12 / (518 * TFLOPS), rel=1e-12)


def test_a_ring_of_two_prices_its_masked_and_unmasked_calls_at_the_shorter_length():
    # half the keys per call and half of the work unmasked: the ring's calls are shorter
    # (slower) but half unmasked (faster); at 8k on H100 the two nearly cancel
    whole = _compute_s(_attention(1e12, 8192, 1.0, "backward"))
    ring = _compute_s(_attention(1e12, 4096, 0.5, "backward"))
    assert ring == pytest.approx(0.5 * 1e12 / SWEEP.rate(4096, True, True) + 0.5 * 1e12 / (499 * TFLOPS), rel=1e-12)
    assert whole != ring


def test_a_sweep_must_be_increasing_consistent_and_below_peak(tmp_path):
    with pytest.raises(ValueError, match="increasing"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(1024, 512), forward=(1, 1), forward_causal=(1, 1),
                           backward=(1, 1))
    with pytest.raises(ValueError, match="3 values for 2"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward=(1, 1, 1),
                           forward_causal=(1, 1), backward=(1, 1))
    _refused(tmp_path, "h100_sxm_80gb.yaml", '"595 TFLOP/s"]', '"5950 TFLOP/s"]', "above the 16-bit peak")


def test_an_encoder_attends_without_a_mask():
    scenario = load_scenario(SCENARIOS / "vit_22b_512xh100.yaml").scenario
    workload = build_workload(scenario, resolve(scenario))
    ops = [op for block in workload.stages[0].forward for op in compute_ops(block.items) if op.kind == "attention"]
    assert ops and all(op.causal_share == 0.0 and op.kernel_seq > 0 for op in ops)


def test_gb200_carries_cudnns_measured_sweep_with_its_own_causal_backward():
    sweep = load_accelerator("gb200").efficiency.attention_sweep
    assert sweep is not None and sweep.backward_causal is not None
    # CUDNN-SDPA-GB200 at 8k tokens: forward 1771 / 1574 (causal), backward 1404 / 1332
    assert sweep.rate(8192, False, False) == pytest.approx(1771e12)
    assert sweep.rate(8192, False, True) == pytest.approx(1574e12)
    assert sweep.rate(8192, True, False) == pytest.approx(1404e12)
    assert sweep.rate(8192, True, True) == pytest.approx(1332e12)  # measured, not the ratio rule
    assert sweep.rate(8192, True, True) != pytest.approx(1404e12 * 1574 / 1771)


def test_mi300x_carries_aiters_measured_sweep():
    accelerator = load_accelerator("mi300x")
    sweep = accelerator.efficiency.attention_sweep
    assert sweep is not None and sweep.backward_causal is not None
    # AITER-FA3-MI300X at 8k tokens, medians over the table's nine batch x head settings:
    # forward 585 / 541 (causal), backward with fp32 dq accumulation 470 / 433
    assert sweep.rate(8192, False, False) == pytest.approx(585e12)
    assert sweep.rate(8192, False, True) == pytest.approx(541e12)
    assert sweep.rate(8192, True, False) == pytest.approx(470e12)
    assert sweep.rate(8192, True, True) == pytest.approx(433e12)
    # a bf16 call of known length is priced from the sweep, not from the single fraction
    model = ComputeModel(accelerator, "bf16")
    burst_s = model.time(_attention(1e12, 8192, 0.0)) - accelerator.efficiency.kernel_overhead
    held = accelerator.efficiency.sustained_attention or accelerator.efficiency.sustained_compute
    assert burst_s * held == pytest.approx(1e12 / 585e12, rel=1e-12)
    assert accelerator.efficiency.attention_forward * accelerator.peak("bf16") != pytest.approx(585e12, rel=0.01)


# FA2-A100 (docs/hardware-sources.md): FlashAttention-2's forward + backward on an A100 80GB SXM4,
# head dim 128, as the flash-attention README prints it, without a mask and with a causal one
FA2_A100_FWD_BWD = {512: (152, 99), 1024: (173, 133), 2048: (187, 155), 4096: (196, 173), 8192: (201, 182),
                    16384: (203, 189)}


@pytest.mark.parametrize("name", ["a100-sxm-80gb", "a100-sxm-40gb"])
def test_a100_sweep_recombines_to_flashattention2s_printed_forward_plus_backward(name):
    sweep = load_accelerator(name).efficiency.attention_sweep
    assert sweep is not None and sweep.kernel == "FlashAttention-2" and sweep.head_dim == 128
    for seq, printed in FA2_A100_FWD_BWD.items():
        for causal, measured in zip((False, True), printed):
            forward, backward = sweep.rate(seq, False, causal), sweep.rate(seq, True, causal)
            # the backward does 2.5x the forward's FLOPs (the benchmark's own count)
            combined = 3.5 / (1.0 / forward + 2.5 / backward)
            # the file keeps one decimal of each series
            assert combined == pytest.approx(measured * TFLOPS, abs=0.15 * TFLOPS)


def test_a100_sweep_splits_at_flashattention2s_own_maxima():
    # Dao 2023: the forward reaches up to 73 % of the A100's peak, the backward up to 63 %; the
    # split keeps that ratio at every length, and at 16k unmasked it lands on those maxima
    accelerator = load_accelerator("a100-sxm-80gb")
    sweep, peak = accelerator.efficiency.attention_sweep, accelerator.peak("bf16")
    for seq in sweep.seq_lengths:
        for causal in (False, True):
            assert sweep.rate(seq, True, causal) / sweep.rate(seq, False, causal) == pytest.approx(63 / 73, abs=1e-3)
    assert sweep.rate(16384, False, False) / peak == pytest.approx(0.73, abs=0.01)
    assert sweep.rate(16384, True, False) / peak == pytest.approx(0.63, abs=0.01)
    # a short causal call runs well below the single fraction that was used before for every length
    assert sweep.rate(2048, False, True) < 0.6 * peak


def test_h100_heads_of_64_and_256_run_at_their_own_published_forward():
    # FA3-SWEEP's cuDNN forward at 4k tokens: head dim 64 408 unmasked, 363 causal; 256: 581, 483
    assert SWEEP.rate(4096, False, False, head_dim=64) == pytest.approx(408e12)
    assert SWEEP.rate(4096, False, True, head_dim=64) == pytest.approx(363e12)
    assert SWEEP.rate(4096, False, False, head_dim=256) == pytest.approx(581e12)
    assert SWEEP.rate(4096, False, True, head_dim=256) == pytest.approx(483e12)
    # head 128 and an unknown head size read the sweep's own series
    for head_dim in (0, 128):
        assert SWEEP.rate(4096, False, True, head_dim=head_dim) == pytest.approx(518e12)


def test_a_head_size_without_a_published_backward_scales_the_reference_backward_by_its_forward():
    for seq in SWEEP.seq_lengths:
        for causal in (False, True):
            ratio = SWEEP.rate(seq, False, causal, head_dim=64) / SWEEP.rate(seq, False, causal)
            assert SWEEP.rate(seq, True, causal, head_dim=64) == pytest.approx(SWEEP.rate(seq, True, causal) * ratio,
                                                                               rel=1e-12)


def test_between_head_sizes_the_rate_is_interpolated_in_log_head_size_and_held_outside():
    # heads of 96, between 64 (363) and 128 (518), causal forward at 4k: log2(96 / 64) = 0.585 of the way
    weight = math.log2(96 / 64)
    assert SWEEP.rate(4096, False, True, head_dim=96) == pytest.approx((363 + weight * (518 - 363)) * TFLOPS, rel=1e-12)
    assert SWEEP.rate(4096, False, True, head_dim=32) == SWEEP.rate(4096, False, True, head_dim=64)
    assert SWEEP.rate(4096, True, False, head_dim=512) == SWEEP.rate(4096, True, False, head_dim=256)


@pytest.mark.parametrize("name", ["h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb"])
def test_small_heads_cost_more_per_flop_than_heads_of_128(name):
    accelerator = load_accelerator(name)
    model = ComputeModel(accelerator, "bf16")
    for seq in (512, 2048, 8192):
        for direction in ("forward", "backward"):
            small = Op("attn.flash", "attention", flops=1e12, direction=direction, kernel_seq=seq, causal_share=1.0,
                       head_dim=64)
            large = Op("attn.flash", "attention", flops=1e12, direction=direction, kernel_seq=seq, causal_share=1.0,
                       head_dim=128)
            assert model.time(small) > model.time(large)


def test_the_h200_takes_the_h100s_measured_head_64_ratio_for_the_same_chip():
    """The H200's cuDNN sweep measured heads of 128 only; its heads of 64 run at the H100's
    measured head-64 / head-128 forward ratio at each length both measured (the same GH100
    chip), and its backward scales as the forward does."""
    h200 = load_accelerator("h200-sxm-141gb").efficiency.attention_sweep
    assert h200 is not None and h200.head_dim == 128
    for seq in (2048, 4096, 8192, 16384):
        for causal in (False, True):
            h100_ratio = SWEEP.rate(seq, False, causal, head_dim=64) / SWEEP.rate(seq, False, causal)
            h200_ratio = h200.rate(seq, False, causal, head_dim=64) / h200.rate(seq, False, causal)
            assert h200_ratio == pytest.approx(h100_ratio, abs=5e-4)
            assert h200.rate(seq, True, causal, head_dim=64) == pytest.approx(
                h200.rate(seq, True, causal) * h200_ratio, rel=1e-9)


def test_a_layers_attention_kernels_carry_its_head_size():
    # wav2vec 2.0 large: 16 heads of 64
    scenario = load_scenario(SCENARIOS / "wav2vec2_large_16xa100.yaml", ["training.attention=flash"]).scenario
    workload = build_workload(scenario, resolve(scenario))
    ops = [op for block in workload.stages[0].forward for op in compute_ops(block.items) if op.kind == "attention"]
    assert ops and {op.head_dim for op in ops} == {64}


def test_other_head_sizes_are_checked_like_the_sweep(tmp_path):
    with pytest.raises(ValueError, match=r"other_head_dims \(head_dim 64\)\.forward has 2 values for 3"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024, 2048), forward=(1, 1, 1),
                           forward_causal=(1, 1, 1), backward=(1, 1, 1),
                           other_head_dims=[{"head_dim": 64, "forward": (1, 1), "forward_causal": (1, 1, 1)}])
    with pytest.raises(ValueError, match="repeats a head dimension"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward=(1, 1), forward_causal=(1, 1),
                           backward=(1, 1), other_head_dims=[{"head_dim": 128, "forward": (1, 1),
                                                              "forward_causal": (1, 1)}])
    _refused(tmp_path, "h100_sxm_80gb.yaml", '"581 TFLOP/s"]', '"5810 TFLOP/s"]', "above the 16-bit peak")


# FA2-H100 (docs/hardware-sources.md): FlashAttention-2's forward + backward on an H100 80GB SXM5,
# head dim 128, without a mask and with a causal one
FA2_H100_FWD_BWD = {512: (248, 163), 1024: (294, 221), 2048: (320, 265), 4096: (326, 294), 8192: (335, 308),
                    16384: (338, 328)}


def test_h100_carries_flashattention2_beside_cudnn_and_it_recombines_to_the_printed_chart():
    efficiency = H100.efficiency
    assert [sweep.id for sweep in efficiency.attention_kernels()] == ["cudnn", "flash-attention-2"]
    assert efficiency.attention_kernel(None) is efficiency.attention_kernel("cudnn") is SWEEP
    fa2 = efficiency.attention_kernel("flash-attention-2")
    for seq, printed in FA2_H100_FWD_BWD.items():
        for causal, measured in zip((False, True), printed):
            combined = 3.5 / (1.0 / fa2.rate(seq, False, causal) + 2.5 / fa2.rate(seq, True, causal))
            assert combined == pytest.approx(measured * TFLOPS, abs=0.15 * TFLOPS)
    assert efficiency.attention_kernel("flash-attention-3") is None


def test_picking_a_kernel_prices_attention_from_its_own_sweep():
    op = _attention(1e12, 4096, 1.0)
    fa2 = ComputeModel(H100, "bf16", attention_kernel="flash-attention-2")
    burst_s = fa2.time(op) - H100.efficiency.kernel_overhead
    assert burst_s * H100.efficiency.sustained_attention == pytest.approx(1e12 / 317.3e12, rel=1e-12)
    assert ComputeModel(H100, "bf16", attention_kernel="cudnn").time(op) == ComputeModel(H100, "bf16").time(op)
    with pytest.raises(InputError, match="no measured sweep of attention kernel 'fa9'"):
        ComputeModel(H100, "bf16", attention_kernel="fa9")


def test_a_run_on_flashattention2_is_slower_than_on_cudnn_on_hopper():
    def step(*overrides: str) -> float:
        scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml", list(overrides)).scenario
        return simulate(scenario).timeline.step_time_s

    assert step("training.attention_kernel=flash-attention-2") > step() == step("training.attention_kernel=cudnn")


@pytest.mark.parametrize("overrides, message", [
    (["training.attention_kernel=fa9"], "h100-sxm-80gb has no measured sweep of 'fa9'; it carries cudnn, "
                                         "flash-attention-2"),
    (["training.attention_kernel=cudnn", "training.attention=unfused"], "training.attention is unfused"),
])
def test_a_kernel_the_part_does_not_carry_is_refused_in_one_line(overrides, message):
    with pytest.raises(InputError, match=message) as caught:
        scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml", overrides).scenario
        resolve(scenario)
    assert caught.value.field == "training.attention_kernel" or "training.attention_kernel" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_other_kernels_need_an_id_and_distinct_ids(tmp_path):
    _refused(tmp_path, "h100_sxm_80gb.yaml", "      id: flash-attention-2", "      # no id", "needs an id")
    _refused(tmp_path, "h100_sxm_80gb.yaml", "      id: flash-attention-2", "      id: cudnn", "ids repeat")


# CUDNN-FP8-B200 and CUDNN-SDPA-B200 (docs/hardware-sources.md): cuDNN Frontend's tables of one B200,
# batch 1, 128 query heads of 128, causal: forward and backward milliseconds per call at 512 to 128k
# tokens, cuDNN through its own graph API (bf16 and fp8 inputs), through PyTorch's SDPA, and the
# flash-attn package
B200_SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
B200_MS = {  # (kernel id, fp8): forward and backward ms at each length
    ("cudnn", False): ((0.035, 0.061, 0.151, 0.482, 1.589, 5.962, 23.228, 94.215, 395.922),
                       (0.107, 0.228, 0.630, 1.650, 5.526, 19.094, 74.527, 284.695, 1248.042)),
    ("cudnn", True): ((0.044, 0.067, 0.141, 0.447, 1.464, 5.197, 19.751, 77.531, 307.690),
                      (0.126, 0.228, 0.618, 1.414, 4.382, 14.964, 55.593, 216.304, 870.832)),
    ("sdpa-cudnn", False): ((0.102, 0.135, 0.287, 0.642, 1.877, 6.602, 24.795, 101.812, 415.333),
                            (0.160, 0.278, 0.925, 1.960, 5.833, 20.460, 79.338, 327.889, 1343.117)),
    ("flash-attention-2", False): ((0.134, 0.223, 0.540, 1.603, 5.499, 20.690, 80.742, 318.926, 1268.653),
                                   (0.264, 0.819, 1.728, 5.025, 17.288, 65.324, 254.491, 1008.204, 4041.247)),
}
B200 = load_accelerator("b200")


def test_b200_sweeps_give_back_the_published_call_times():
    # the causal forward of one call: 4 s^2 heads d / 2 FLOPs (these tables halve the square), the
    # backward 2.5x it
    assert [kernel.id for kernel in B200.efficiency.attention_kernels()] == ["cudnn", "sdpa-cudnn",
                                                                            "flash-attention-2"]
    for (kernel_id, fp8), (forward_ms, backward_ms) in B200_MS.items():
        kernel = B200.efficiency.attention_kernel(kernel_id)
        for seq, milliseconds in zip(B200_SEQS, zip(forward_ms, backward_ms)):
            for backward, ms in zip((False, True), milliseconds):
                flops = 4 * seq * seq * 128 * 128 / 2 * (2.5 if backward else 1.0)
                # the table prints times to 1 us and the file rates to 0.1 TFLOP/s: both roundings allowed
                rel = 0.5e-3 / ms + 0.05e12 / (flops / (ms / 1e3))
                assert flops / kernel.rate(seq, backward, True, fp8=fp8) == pytest.approx(ms / 1e3, rel=rel)


def test_a_causal_only_sweep_prices_unmasked_calls_at_the_single_fraction():
    sweep = B200.efficiency.attention_sweep
    assert sweep.covers(True) and not sweep.covers(False)
    with pytest.raises(ValueError, match="causal mask only"):
        sweep.rate(8192, False, False)
    model, eff = ComputeModel(B200, "bf16"), B200.efficiency

    def compute_s(op: Op) -> float:
        return (model.time(op) - eff.kernel_overhead) * eff.sustained_attention

    peak = B200.peak("bf16")
    assert compute_s(_attention(1e12, 8192, 0.0)) == pytest.approx(1e12 / (peak * eff.attention_forward), rel=1e-12)
    assert compute_s(_attention(1e12, 8192, 0.0, "backward")) == \
        pytest.approx(1e12 / (peak * eff.attention_backward), rel=1e-12)
    assert compute_s(_attention(1e12, 2048, 1.0)) == pytest.approx(1e12 / (907.5 * TFLOPS), rel=1e-12)
    # half and half: each share at its own rate
    assert compute_s(_attention(1e12, 2048, 0.5)) == \
        pytest.approx(0.5e12 / (907.5 * TFLOPS) + 0.5e12 / (peak * eff.attention_forward), rel=1e-12)


def test_short_causal_calls_cost_more_per_flop_on_b200_and_pytorchs_wrapper_costs_more_still():
    # the single fraction (the median at 2k-32k) is the 8k rate: a 2k call runs below it, a 16k one
    # above; PyTorch's SDPA around the same cuDNN kernel runs slower at every length, most at short ones
    sweep, sdpa = B200.efficiency.attention_sweep, B200.efficiency.attention_kernel("sdpa-cudnn")
    rates = [sweep.rate(seq, False, True) for seq in (1024, 2048, 4096, 8192)]
    assert rates == sorted(rates)
    assert sweep.rate(2048, False, True) < B200.peak("bf16") * B200.efficiency.attention_forward < \
        sweep.rate(16384, False, True)
    ratios = [sdpa.rate(seq, False, True) / sweep.rate(seq, False, True) for seq in (2048, 8192, 131072)]
    assert all(ratio < 1 for ratio in ratios) and ratios == sorted(ratios)


def test_fp8_attention_runs_at_its_own_measured_rate_where_a_part_has_one():
    # H200, cuDNN at 8k tokens, causal: fp8 forward 964 where bf16 runs 644, but fp8 backward 430
    # where bf16 runs 541; a part without fp8 series keeps its fractions of the fp8 peak
    h200 = load_accelerator("h200-sxm-141gb")

    def compute_s(op: Op) -> float:
        return _compute_s(op, "fp8", h200)

    fp8_forward = Op("attn.flash", "attention", flops=1e12, direction="forward", kernel_seq=8192, causal_share=1.0,
                     dtype="fp8")
    fp8_backward = Op("attn.flash.grad", "attention", flops=1e12, direction="backward", kernel_seq=8192,
                      causal_share=1.0, dtype="fp8")
    assert compute_s(fp8_forward) == pytest.approx(1e12 / (964 * TFLOPS), rel=1e-12)
    assert compute_s(fp8_backward) == pytest.approx(1e12 / (430 * TFLOPS), rel=1e-12)
    bf16_backward = Op("attn.flash.grad", "attention", flops=1e12, direction="backward", kernel_seq=8192,
                       causal_share=1.0, dtype="bf16")
    assert compute_s(bf16_backward) < compute_s(fp8_backward)
    # a kernel without fp8 series (MI300X's AITER sweep): fp8 inputs at the bf16 sweep's rate, not its fp8 peak's
    mi300x = load_accelerator("mi300x")
    assert _compute_s(fp8_forward, "fp8", mi300x) == pytest.approx(1e12 / (541 * TFLOPS), rel=1e-12)
    # the H100's fp8 series, inferred from the H200's on the same chip, keep Hopper's slow fp8 causal backward
    h100 = H100.efficiency.attention_sweep
    assert h100.rate(8192, False, True, fp8=True) > h100.rate(8192, False, True)
    assert h100.rate(8192, True, True, fp8=True) < h100.rate(8192, True, True)
    # another head size: the fp8 rate scaled as the bf16 sweep scales (GB200: MLA's 192 against 128)
    gb200 = load_accelerator("gb200").efficiency.attention_sweep
    assert gb200.rate(8192, False, True, head_dim=192, fp8=True) == pytest.approx(
        2047e12 * gb200.rate(8192, False, True, head_dim=192) / gb200.rate(8192, False, True), rel=1e-12)


def test_fp8_series_are_checked(tmp_path):
    with pytest.raises(ValueError, match="fp8.forward and fp8.backward"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward_causal=(1, 1),
                           backward_causal=(1, 1), fp8={"forward": (1, 1), "forward_causal": (1, 1),
                                                        "backward_causal": (1, 1)})
    with pytest.raises(ValueError, match=r"fp8\.forward_causal has 1 values for 2"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward_causal=(1, 1),
                           backward_causal=(1, 1), fp8={"forward_causal": (1,), "backward_causal": (1, 1)})
    _refused(tmp_path, "h200_sxm_141gb.yaml", '"1062 TFLOP/s"]', '"10620 TFLOP/s"]', "above the fp8 peak")


def test_a_run_on_flashattention2_is_slower_than_on_cudnn_on_blackwell():
    def step(*overrides: str) -> float:
        scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml",
                                 ["cluster.system=hgx-b200", *overrides]).scenario
        return simulate(scenario).timeline.step_time_s

    assert step("training.attention_kernel=flash-attention-2") > step() == step("training.attention_kernel=cudnn")


def test_a_causal_only_sweep_is_checked(tmp_path):
    with pytest.raises(ValueError, match="forward and backward .without a mask. go together"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward=(1, 1), forward_causal=(1, 1),
                           backward_causal=(1, 1))
    with pytest.raises(ValueError, match="backward_causal is needed"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward_causal=(1, 1))
    with pytest.raises(ValueError, match=r"other_head_dims \(head_dim 64\)\.forward must be given exactly"):
        AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward_causal=(1, 1),
                           backward_causal=(1, 1), other_head_dims=[{"head_dim": 64, "forward": (1, 1),
                                                                     "forward_causal": (1, 1)}])
    causal_only = AttentionSweepSpec(kernel="k", head_dim=128, seq_lengths=(512, 1024), forward_causal=(2, 4),
                                     backward_causal=(1, 2), other_head_dims=[{"head_dim": 64,
                                                                               "forward_causal": (1, 2)}])
    # a head size without its own backward: the parent's causal backward times the forward ratio
    assert causal_only.rate(1024, True, True, head_dim=64) == pytest.approx(2 * 2 / 4)
    _refused(tmp_path, "b200.yaml", '"1355.4 TFLOP/s"]', '"13554 TFLOP/s"]', "above the 16-bit peak")


# CUDNN-SDPA-GB200-MLA: cuDNN on a GB200 at DeepSeek-V3's shapes (batch 2, 128 heads, query/key heads of
# 192, value heads of 128): milliseconds per call at 2k-32k tokens
GB200_MLA_MS = {  # seq: (forward unmasked, causal; non-deterministic backward unmasked, causal)
    2048: (0.461, 0.321, 1.706, 1.056), 4096: (1.650, 0.977, 6.085, 3.383), 8192: (6.249, 3.470, 25.403, 11.984),
    16384: (24.270, 13.103, 105.115, 50.424), 32768: (111.031, 50.456, 421.194, 212.546),
}


def test_gb200_mla_heads_give_back_the_published_call_times():
    sweep = load_accelerator("gb200").efficiency.attention_sweep
    for seq, times in GB200_MLA_MS.items():
        forward = 2 * 2 * 128 * seq * seq * (192 + 128)
        backward = flash_backward_flops(forward, 192, 128)
        for (is_backward, causal), ms in zip(((False, False), (False, True), (True, False), (True, True)), times):
            # a causal call counts the s (s + 1) / 2 pairs of the lower triangle, diagonal included
            flops = (backward if is_backward else forward) * ((1 + 1 / seq) / 2 if causal else 1)
            rel = 0.5e-3 / ms + 0.5e12 / (flops / (ms / 1e3))  # times to 1 us, rates to 1 TFLOP/s
            assert flops / sweep.rate(seq, is_backward, causal, head_dim=192) == pytest.approx(ms / 1e3, rel=rel)


def test_the_backward_does_five_matmuls_over_the_head_sizes_each_runs_at():
    # equal head sizes: FlashAttention-2's 2.5 (Dao 2023); MLA's 192 / 128: 2.6
    assert flash_backward_flops(1.0, 128, 128) == 2.5
    assert flash_backward_flops(1.0, 192, 128) == pytest.approx(2.6)
    scenario = load_scenario(SCENARIOS / "deepseek_v3_2048xh100.yaml").scenario
    workload = build_workload(scenario, resolve(scenario))
    stage = workload.stages[1]
    forward = [op for block in stage.forward for op in compute_ops(block.items) if op.name == "attn.flash"]
    backward = [op for block in stage.backward for op in compute_ops(block.items) if op.name == "attn.flash.grad"]
    assert forward and len(forward) == len(backward)
    assert backward[0].flops == pytest.approx(2.6 * forward[0].flops)


def test_a_causal_call_counts_the_triangles_pairs_as_the_published_rates_do():
    # the rates count s (s + 1) / 2 pairs per head; the partly masked diagonal blocks' time is inside
    # them, so an op that counted whole blocks (129 / 256 of the square at 2k in blocks of 128, not
    # 2049 / 4096) would be charged for those blocks twice
    scenario = load_scenario(SCENARIOS / "llama3_8b_64xh100_dp8.yaml", ["parallel.cp=1"]).scenario
    layout = resolve(scenario)
    workload = build_workload(scenario, layout)
    model = scenario.model
    s, heads = model.seq_length, model.num_attention_heads // layout.tp
    d = model.hidden_size // model.num_attention_heads
    tokens = scenario.parallel.microbatch_size * s
    forward = [op for block in workload.stages[0].forward for op in compute_ops(block.items) if op.name == "attn.flash"]
    assert forward and forward[0].causal_share == 1.0
    assert forward[0].flops == pytest.approx(2 * tokens * s * heads * 2 * d * (s + 1) / (2 * s), rel=1e-12)


def test_fp8_inputs_the_fp8_series_do_not_cover_run_at_the_bf16_rates():
    # B200: fp8 series measured under a causal mask only; an unmasked fp8 share takes the bf16
    # fraction of the bf16 peak, and a call of unknown length too, never a fraction of the fp8 peak
    model, eff = ComputeModel(B200, "fp8"), B200.efficiency

    def compute_s(op: Op) -> float:
        return (model.time(op) - eff.kernel_overhead) * eff.sustained_attention

    ring = Op("attn.flash", "attention", flops=1e12, direction="forward", kernel_seq=4096, causal_share=0.5,
              dtype="fp8")
    assert compute_s(ring) == pytest.approx(0.5e12 / (1230.7 * TFLOPS) + 0.5e12 / (B200.peak("bf16") *
                                                                                     eff.attention_forward), rel=1e-12)
    unknown = Op("attn.flash", "attention", flops=1e12, direction="forward", kernel_seq=0, causal_share=1.0,
                 dtype="fp8")
    assert compute_s(unknown) == pytest.approx(1e12 / (B200.peak("bf16") * eff.attention_forward), rel=1e-12)


def test_the_gh200_prices_attention_as_the_h200_the_same_die():
    """The GH200 file carries no attention measurement of its own: both kernels, every head size,
    mask and pass at the H200's rates."""
    gh200, h200 = (load_accelerator(name).efficiency for name in ("gh200", "h200-sxm-141gb"))
    assert [k.id for k in gh200.other_attention_kernels] == [k.id for k in h200.other_attention_kernels] == [
        "flash-attention-2"]
    pairs = [(gh200.attention_sweep, h200.attention_sweep),
             (gh200.other_attention_kernels[0], h200.other_attention_kernels[0])]
    for ours, theirs in pairs:
        for seq in (1024, 4096, 16384):
            for head_dim in (64, 96, 128):
                for backward in (False, True):
                    assert ours.rate(seq, backward, True, head_dim=head_dim) == theirs.rate(seq, backward, True,
                                                                                            head_dim=head_dim)
