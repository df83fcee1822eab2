"""GEMM kernels as they ran: which shared the GPU with other streams, and which were misaligned.

A kernel's time in a trace is its time alone only when no other stream ran beside it;
beside a collective, mpsim prices compute slower by the SMs the collective holds. And a
GEMM with a dimension that is not a whole number of 16-byte vectors runs in the
library's element-at-a-time (``align1``) kernels, which the fit prices at an efficiency
of their own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpsim.calibrate.trace_fit.build import beside_collective_s, held_out_gemms
from mpsim.calibrate.trace_fit.gemm import fit_gemms
from mpsim.calibrate.trace_fit.robust import fit_nonnegative
from mpsim.calibrate.trace_fit.samples import GemmSample, TraceSamples
from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.specs.accelerator import BYTES_PER_ELEMENT
from mpsim.specs.calibration import GemmShapeFit, gemm_misaligned
from mpsim.specs.catalog import load_accelerator, load_system
from mpsim.traces.concurrency import beside_shares
from mpsim.traces.model import Kernel
from mpsim.traces.read import load_trace
from tests.conftest import SCENARIOS

DATA = Path(__file__).parent / "data" / "traces"
A100 = load_accelerator("a100-sxm-80gb")
TRUE_GEMM = GemmShapeFit(dtype="tf32", element_bytes=4, peak_flops=156e12, launch_s=6e-6, efficiency=0.6,
                         bandwidth=800e9, output_bandwidth=400e9, misaligned_efficiency=0.25)
ALIGNED = [(1, m, n, k) for m in (256, 1024, 4096) for n in (64, 512, 2048) for k in (128, 1024)]
MISALIGNED = [(1, 1024, 512, 1705), (1, 1705, 512, 1024), (1, 1024, 9375, 512), (1, 647, 96, 1024)]


def _kernel(name: str, category: str, start_s: float, duration_s: float, stream: int) -> Kernel:
    return Kernel(name, category, start_s, duration_s, stream, None)


def test_beside_shares_count_other_streams_only_and_collectives_apart():
    gemm = _kernel("gemm", "gemm", 0.0, 10.0, 7)
    same_stream = _kernel("next gemm", "gemm", 10.0, 5.0, 7)  # the same stream never runs beside itself
    collective = _kernel("ncclKernel_AllToAll", "collective", 5.0, 10.0, 20)
    copy = _kernel("memcpy", "memcpy", 12.0, 2.0, 21)
    shares = beside_shares([gemm, same_stream, collective, copy])
    assert (shares[id(gemm)].any_kernel, shares[id(gemm)].collective) == (0.5, 0.5)
    assert (shares[id(same_stream)].any_kernel, shares[id(same_stream)].collective) == (1.0, 1.0)
    # the collective: beside the two GEMMs from 5 to 15 and the copy inside that: all of it, no collective
    assert (shares[id(collective)].any_kernel, shares[id(collective)].collective) == (1.0, 0.0)
    assert shares[id(copy)].collective == 1.0
    alone = _kernel("alone", "gemm", 20.0, 1.0, 7)
    assert beside_shares([gemm, alone, collective])[id(alone)].alone


def test_a_dimension_off_the_16_byte_vector_makes_a_gemm_misaligned():
    assert not gemm_misaligned(1024, 1024, 2048, 4)
    assert gemm_misaligned(1024, 512, 1705, 4) and gemm_misaligned(1705, 512, 1024, 4)
    # 1028 is a whole number of 4-byte groups of 4 but not of 2-byte groups of 8
    assert not gemm_misaligned(1028, 64, 64, 4) and gemm_misaligned(1028, 64, 64, 2)
    assert gemm_misaligned(1024, 1024, 1032, 1) and not gemm_misaligned(1024, 1024, 1040, 1)


def test_the_library_runs_align1_kernels_exactly_on_the_shapes_the_rule_calls_misaligned():
    # HTA's 8-rank recommendation trace (extract): cutlass names its kernels _align1 / _align4
    trace = load_trace(str(DATA / "recsys8_step1010.json.gz"))
    named = [(kernel.gemm, "_align1" in kernel.name) for kernel in trace.kernels
             if kernel.category == "gemm" and kernel.gemm is not None and "_align" in kernel.name]
    assert sum(align1 for _, align1 in named) >= 3 and sum(not align1 for _, align1 in named) >= 10
    for gemm, align1 in named:
        assert gemm_misaligned(gemm.m, gemm.n, gemm.k, BYTES_PER_ELEMENT[gemm.dtype]) == align1, gemm


def _samples(shapes, model: GemmShapeFit, repeats: int = 2) -> list[GemmSample]:
    return [GemmSample(*shape, "tf32", model.seconds(*shape)) for shape in shapes for _ in range(repeats)]


def test_the_fit_gives_back_the_efficiency_of_misaligned_gemms():
    fits, _ = fit_gemms(_samples(ALIGNED + MISALIGNED, TRUE_GEMM), A100)
    fit = fits[0]
    for field in ("launch_s", "efficiency", "bandwidth", "output_bandwidth", "misaligned_efficiency"):
        assert getattr(fit, field) == pytest.approx(getattr(TRUE_GEMM, field), rel=1e-3), field
    # priced as such: the same FLOPs cost more off the vector
    assert fit.seconds(1, 1024, 512, 1705) > 1.5 * fit.seconds(1, 1024, 512, 1704)


def test_misaligned_gemms_are_never_priced_faster_than_aligned_ones():
    # kernels where the misaligned shapes ran at the aligned rate: no extra cost, no term
    aligned_only = TRUE_GEMM.model_copy(update={"misaligned_efficiency": None})
    fit = fit_gemms(_samples(ALIGNED + MISALIGNED, aligned_only), A100)[0][0]
    assert fit.misaligned_efficiency is None
    assert fit.efficiency == pytest.approx(0.6, rel=1e-3)
    # and where they ran faster than the aligned form says, the fit still prices them no faster
    fast = [GemmSample(*shape, "tf32", 0.5 * aligned_only.seconds(*shape)) for shape in MISALIGNED for _ in range(2)]
    fit = fit_gemms(_samples(ALIGNED, aligned_only) + fast, A100)[0][0]
    assert fit.misaligned_efficiency is None or fit.misaligned_efficiency <= (fit.efficiency or 0.0)
    for batch, m, n, k in MISALIGNED:
        # one element more than an aligned neighbour never costs less than it
        assert fit.seconds(batch, m, n, k) >= fit.seconds(batch, m - m % 4, n - n % 4, k - k % 4)


def test_compute_beside_a_collective_runs_on_the_sms_it_leaves():
    assert beside_collective_s(10e-6, 0.0, 0.25) == 10e-6
    assert beside_collective_s(10e-6, 1.0, 0.25) == pytest.approx(10e-6 / 0.75)
    # half its time beside: 10 us of work = t/2 at full speed + t/2 at 3/4
    t = beside_collective_s(10e-6, 0.5, 0.25)
    assert 0.5 * t + 0.5 * t * 0.75 == pytest.approx(10e-6)
    # the same SM share as the engine's overlap of compute with a collective
    scenario = load_scenario(SCENARIOS / "megatron_22b_8xa100.yaml").scenario
    system = load_system("dgx-a100")
    assert CostModel(scenario, resolve(scenario)).comm_sm_fraction == system.collective_sm_share() == 24 / 108


def test_a_held_out_gemm_beside_a_collective_is_priced_as_it_ran():
    share = load_system("dgx-a100").collective_sm_share(108)
    fitted = _samples(ALIGNED, TRUE_GEMM)
    # held out (every third shape from the second): half of them ran entirely beside an all-to-all,
    # slowed as the SM share says
    samples = TraceSamples()
    for index, sample in enumerate(fitted):
        if index % 2:
            sample = GemmSample(sample.batch, sample.m, sample.n, sample.k, sample.dtype,
                                sample.seconds / (1.0 - share), 1.0, 1.0)
        samples.gemms.append(sample)
    result = held_out_gemms(samples, A100, {}, share)
    assert max(result.after_pct) < 0.5
    summary = result.summary()
    assert summary.alone_kernels + summary.beside_kernels == summary.kernels
    assert summary.beside_kernels > 0 and summary.alone_kernels > 0
    # priced as if alone, the beside kernels would be off by the SM share
    alone_priced = held_out_gemms(samples, A100, {}, 0.0)
    assert max(alone_priced.after_pct_where(False)) == pytest.approx(100 * share, rel=0.02)


def test_an_extra_cost_enters_the_fit_only_beside_the_cost_it_adds_to():
    x = np.linspace(1.0, 10.0, 20)
    flag = (np.arange(20) % 2).astype(float)
    seconds = 3.0 * x * flag + 1.0  # only the flagged kernels take time beyond the fixed part
    features = np.column_stack([np.ones_like(x), x, x * flag])
    free = fit_nonnegative(features, seconds)
    assert free[1] == 0.0 and free[2] == pytest.approx(3.0, rel=1e-3)  # the extra alone fits best
    tied = fit_nonnegative(features, seconds, needs={2: 1})
    assert tied[2] == 0.0 or tied[1] > 0.0


def test_the_summary_says_how_much_longer_gemms_took_entirely_beside_a_collective():
    from mpsim.traces.model import Gemm, Trace
    from mpsim.traces.report import format_summary
    from mpsim.traces.summary import summarize

    def gemm_kernel(start_s, duration_s, m):
        return Kernel("cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4", "gemm", start_s, duration_s, 7, None,
                      gemm=Gemm(1, m, 512, 1024, "tf32", "aten::mm"))

    kernels = [
        gemm_kernel(0e-6, 10e-6, 1024), gemm_kernel(20e-6, 10e-6, 1024), gemm_kernel(40e-6, 12e-6, 1024),  # alone
        gemm_kernel(60e-6, 20e-6, 2048),  # alone, never beside: no ratio
        _kernel("ncclKernel_AllToAll_RING_SIMPLE_Sum_float", "collective", 100e-6, 100e-6, 20),
        gemm_kernel(110e-6, 15e-6, 1024), gemm_kernel(130e-6, 15e-6, 1024),  # entirely beside: 1.5x of 10
        gemm_kernel(190e-6, 40e-6, 1024),  # partly beside (10 of 40 us): neither
    ]
    trace = Trace(source="synthetic", device_name="NVIDIA A100-SXM4-80GB", device_sms=108,
                  device_memory_bytes=80 * 2 ** 30, compute_capability=(8, 0), rank=0, world_size=8,
                  kernels=tuple(sorted(kernels, key=lambda k: k.start_s)))
    beside = summarize(trace).beside_collective
    assert (beside.shapes, beside.alone_kernels, beside.beside_kernels) == (1, 3, 2)
    assert beside.median_ratio == pytest.approx(1.5) and beside.min_ratio == beside.max_ratio
    assert "took 1.50x their time alone" in format_summary(summarize(trace))
    # without the collective no shape ran beside one, and the line is left out
    quiet = Trace(source="synthetic", device_name=trace.device_name, device_sms=108, device_memory_bytes=1,
                  compute_capability=(8, 0), rank=0, world_size=8,
                  kernels=tuple(k for k in trace.kernels if k.category == "gemm"))
    assert summarize(quiet).beside_collective is None
    assert "beside a collective" not in format_summary(summarize(quiet))


def test_the_summary_marks_misaligned_gemm_shapes_and_says_what_they_cost():
    from mpsim.traces.model import Gemm, Trace
    from mpsim.traces.report import format_summary
    from mpsim.traces.summary import summarize

    def gemm_kernel(start_s, duration_s, k):
        return Kernel("cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align1", "gemm", start_s, duration_s, 7, None,
                      gemm=Gemm(1, 1024, 512, k, "tf32", "aten::mm"))

    kernels = (gemm_kernel(0.0, 121e-6, 1705), gemm_kernel(200e-6, 60e-6, 1704), gemm_kernel(300e-6, 60e-6, 1704))
    trace = Trace(source="synthetic", device_name="NVIDIA A100-SXM4-80GB", device_sms=108,
                  device_memory_bytes=80 * 2 ** 30, compute_capability=(8, 0), rank=0, world_size=8, kernels=kernels)
    summary = summarize(trace)
    assert {row.k: row.misaligned for row in summary.gemms} == {1705: True, 1704: False}
    text = format_summary(summary)
    marked = [line for line in text.splitlines() if line.rstrip().endswith(" *")]
    assert len(marked) == 1 and " 1705 " in marked[0]
    assert "1 of 2 shapes, 121.0 us of 241.0 us of the GEMM kernels' time" in text
    aligned = Trace(source="synthetic", device_name=trace.device_name, device_sms=108, device_memory_bytes=1,
                    compute_capability=(8, 0), rank=0, world_size=8, kernels=kernels[1:])
    assert "16-byte vectors" not in format_summary(summarize(aligned))
