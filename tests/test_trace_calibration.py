"""Calibrating from profiler traces: the fit, the held-out split, the profile, the command.

The traces here are made by the tests: kernels whose durations follow a known GEMM form
and a known alpha-beta line, so the fit must give those numbers back. The command is run
on a small Kineto JSON file written the way the PyTorch profiler writes one (an op with
``Input Dims``, its runtime launch, the kernel with the launch's correlation id).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from mpsim.calibrate.trace_fit.build import build_profile
from mpsim.calibrate.trace_fit.comms import fit_collectives
from mpsim.calibrate.trace_fit.gemm import fit_gemms
from mpsim.calibrate.trace_fit.robust import fit_nonnegative
from mpsim.calibrate.trace_fit.samples import CollectiveSample, trace_samples
from mpsim.calibrate.trace_fit.split import split_by_key
from mpsim.cli import main
from mpsim.cost.calibrated import CalibratedCosts
from mpsim.cost.compute import ComputeModel
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.calibration import CalibrationProfile, GemmShapeFit, write_profile
from mpsim.specs.catalog import load_accelerator, load_system
from mpsim.specs.yamlio import read_yaml
from mpsim.traces.model import Collective, CpuOp, Gemm, Kernel, Trace
from mpsim.workload.ops import Op
from tests.conftest import SCENARIOS

A100_80 = "NVIDIA A100-SXM4-80GB"
# the form the fit must recover (tf32 on an A100: 156 TFLOP/s peak)
TRUE_GEMM = GemmShapeFit(dtype="tf32", element_bytes=4, peak_flops=156e12, launch_s=6e-6, efficiency=0.6,
                         bandwidth=800e9, output_bandwidth=400e9)
TRUE_LATENCY_S, TRUE_BANDWIDTH = 20e-6, 50e9
SHAPES = [(1, m, n, k) for m in (256, 1024, 4096) for n in (64, 512, 2048) for k in (128, 1024)] + \
         [(8, 128, 128, 64), (16, 512, 64, 256)]
SIZES = [2.0 ** p for p in range(12, 28, 2)]


def synthetic_trace(repeats: int = 2) -> Trace:
    """GEMM kernels timed by ``TRUE_GEMM`` and all-reduces by the true line, each after its op."""
    kernels, clock = [], 0.0
    for _ in range(repeats):
        for batch, m, n, k in SHAPES:
            # launched while the previous kernel still runs (it ends 8 us before ``clock``): a queued kernel,
            # 10 us after the previous one
            op = CpuOp("aten::bmm" if batch > 1 else "aten::mm", clock - 9e-6, 5e-6, 1)
            seconds = TRUE_GEMM.seconds(batch, m, n, k)
            kernels.append(Kernel("cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4", "gemm", clock + 2e-6,
                                  seconds, 7, len(kernels), op=op, gemm=Gemm(batch, m, n, k, "tf32", op.name)))
            clock += seconds + 10e-6
        for size in SIZES:
            op = CpuOp("c10d::allreduce_", clock, 5e-6, 1)
            seconds = TRUE_LATENCY_S + size / TRUE_BANDWIDTH
            kernels.append(Kernel("ncclKernel_AllReduce_RING_LL_Sum_float", "collective", clock + 2e-6, seconds, 9,
                                  len(kernels), op=op,
                                  collective=Collective("all-reduce", size, 8, "RING", "LL", "fp32")))
            clock += seconds + 10e-6
    return Trace(source="synthetic", device_name=A100_80, device_sms=108, device_memory_bytes=80 * 2 ** 30,
                 compute_capability=(8, 0), rank=0, world_size=8, kernels=tuple(kernels))


def test_fit_recovers_the_form_that_made_the_kernels():
    samples = trace_samples([synthetic_trace()])
    fits, skipped = fit_gemms(samples.gemms, load_accelerator("a100-sxm-80gb"))
    assert not skipped and [f.dtype for f in fits] == ["tf32"]
    fit = fits[0]
    for field in ("launch_s", "efficiency", "bandwidth", "output_bandwidth"):
        assert getattr(fit, field) == pytest.approx(getattr(TRUE_GEMM, field), rel=1e-3), field
    assert fit.shapes == len(SHAPES) and fit.kernels == 2 * len(SHAPES)
    lines, _ = fit_collectives(samples.collectives)
    assert len(lines) == 1 and (lines[0].kind, lines[0].ranks, lines[0].algorithm) == ("all-reduce", 8, "RING")
    assert lines[0].latency_s == pytest.approx(TRUE_LATENCY_S, rel=1e-3)
    assert lines[0].bandwidth == pytest.approx(TRUE_BANDWIDTH, rel=1e-3)


def test_robust_fit_ignores_a_few_delayed_kernels_and_drops_a_negative_term():
    x = np.linspace(1.0, 10.0, 40)
    seconds = 2.0 + 3.0 * x
    seconds[::10] *= 4.0  # four kernels held up four times as long
    # a third column that fits only with a negative cost (time falls with it) is dropped, not clamped
    features = np.column_stack([np.ones_like(x), x, -x + 11.0])
    coefficients = fit_nonnegative(features, seconds)
    assert coefficients[0] == pytest.approx(2.0, rel=1e-3) and coefficients[1] == pytest.approx(3.0, rel=1e-3)
    assert coefficients[2] == 0.0
    # a floor: a coefficient that would sit below 4 leaves its term out
    assert fit_nonnegative(features[:, 1:2], 3.0 * x, floors=[4.0])[0] == 0.0


def test_held_out_split_is_by_shape_and_deterministic():
    samples = trace_samples([synthetic_trace(repeats=3)])
    fitted, held = split_by_key(samples.gemms, key=lambda s: s.key)
    assert not {s.key for s in fitted} & {s.key for s in held}
    assert len(fitted) + len(held) == len(samples.gemms)
    distinct = len({s.key for s in samples.gemms})
    assert len({s.key for s in held}) == math.ceil((distinct - 1) / 3)  # the 2nd, 5th, 8th, ... of the keys
    assert split_by_key(list(reversed(samples.gemms)), key=lambda s: s.key)[1] == list(reversed(held))
    lines = [CollectiveSample("all-reduce", "RING", "LL", 2, size, 1e-4) for size in (1.0, 2.0, 3.0)] + \
            [CollectiveSample("broadcast", "RING", "LL", 2, size, 1e-4) for size in (1.0, 2.0)]
    _, held_lines = split_by_key(lines, key=lambda s: s.key, group=lambda s: s.group)
    # within each line: the second size of the all-reduce and of the broadcast
    assert sorted((s.kind, s.message_bytes) for s in held_lines) == [("all-reduce", 2.0), ("broadcast", 2.0)]


def _profile(trace: Trace | None = None):
    system = load_system("dgx-a100")
    trace = trace or synthetic_trace()
    return build_profile(trace_samples([trace]), ["synthetic.json"], trace.device_name, 108, "dgx-a100", system,
                         system.accelerator)


def test_held_out_error_falls_with_the_fit_and_the_profile_records_it():
    result = _profile()
    info = result.profile.trace_fit
    assert info.gemm.kernels == len(result.gemm.after_pct) > 0
    assert info.gemm.after_median_pct < 0.5 < info.gemm.before_median_pct
    assert info.collectives.after_median_pct < 0.5
    assert result.profile.source == "trace" and result.profile.device.name == A100_80
    assert result.profile.device.kind == "cuda" and result.profile.device.cores is None
    launch = result.profile.compute.launch
    assert launch.queued_gap_s == pytest.approx(10e-6) and launch.queued_samples == 2 * len(SHAPES) - 2


def test_profile_round_trips_through_yaml_and_json(tmp_path):
    profile = _profile().profile
    for name in ("fitted.yaml", "fitted.json"):
        write_profile(profile, tmp_path / name)
        again = CalibrationProfile.model_validate(read_yaml(tmp_path / name))
        assert again == profile
    text = (tmp_path / "fitted.yaml").read_text()
    assert "cores" not in text and "gemm_fits" in text  # host fields a trace cannot know are left out


def test_fitted_profile_prices_an_a100_scenario(tmp_path):
    path = tmp_path / "a100.yaml"
    write_profile(_profile().profile, path)
    scenario_file = SCENARIOS / "megatron_22b_8xa100.yaml"
    plain = load_scenario(scenario_file, ["training.dtype=tf32"]).scenario
    fitted = load_scenario(scenario_file, ["training.dtype=tf32", f"calibration={path}"]).scenario
    assert fitted.calibration.source == "trace"
    step_plain = simulate(plain).timeline.pipeline_end_s
    step_fitted = simulate(fitted).timeline.pipeline_end_s
    assert math.isfinite(step_fitted) and step_fitted > 0 and step_fitted != step_plain
    # op by op: a GEMM the fit covers is the fit plus the trace's queued gap; what it lacks is the datasheet
    datasheet = ComputeModel(plain.cluster.system.accelerator, "tf32")
    costs = CalibratedCosts(fitted.calibration, datasheet)
    fit = fitted.calibration.compute.gemm_fits[0]
    small = Op("fc", "gemm", flops=2.0 * 1024 * 512 * 1024, bytes=1.0, shape=(1, 1024, 512, 1024))
    gap_s = fitted.calibration.compute.launch.queued_gap_s
    assert costs.measured_s(small) == pytest.approx(fit.seconds(1, 1024, 512, 1024) + gap_s)
    huge = Op("fc", "gemm", flops=2.0 * 8192 ** 3, bytes=3 * 4.0 * 8192 ** 2, shape=(1, 8192, 8192, 8192))
    assert costs.measured_s(huge) == datasheet.time(huge)  # beyond the largest GEMM fitted
    attention = Op("core", "attention", flops=1e12, direction="forward")
    assert costs.measured_s(attention) == datasheet.time(attention)
    assert costs.collective_s("all-reduce", 2.0 ** 20, 8) == pytest.approx(TRUE_LATENCY_S + 2.0 ** 20 / TRUE_BANDWIDTH,
                                                                            rel=1e-3)
    assert costs.collective_s("all-gather", 2.0 ** 20, 8) is None  # a kind the trace did not show


def kineto_file(path, device_name: str = A100_80) -> None:
    """A small Kineto trace: aten::mm ops launching GEMM kernels timed by ``TRUE_GEMM``, and sized all-reduces."""
    events, clock, correlation = [], 1000.0, 1
    for _ in range(2):
        for batch, m, n, k in SHAPES:
            if batch > 1:
                continue
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": clock, "dur": 8.0,
                           "args": {"Input Dims": [[m, k], [k, n]], "Input type": ["float", "float"]}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": clock + 2.0, "dur": 3.0, "args": {"correlation": correlation}})
            duration_us = TRUE_GEMM.seconds(1, m, n, k) * 1e6
            events.append({"ph": "X", "cat": "kernel", "name": "cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4",
                           "pid": 0, "tid": 7, "ts": clock + 6.0, "dur": duration_us,
                           "args": {"correlation": correlation, "stream": 7, "device": 0}})
            clock += duration_us + 20.0
            correlation += 1
        for size in SIZES:
            duration_us = (TRUE_LATENCY_S + size / TRUE_BANDWIDTH) * 1e6
            events.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",
                           "pid": 0, "tid": 9, "ts": clock, "dur": duration_us,
                           "args": {"correlation": correlation, "stream": 9, "device": 0,
                                    "Collective name": "allreduce", "In msg nelems": int(size / 4),
                                    "Out msg nelems": int(size / 4), "Group size": 8, "dtype": "Float"}})
            clock += duration_us + 20.0
            correlation += 1
    trace = {"deviceProperties": [{"id": 0, "name": device_name, "numSms": 108, "totalGlobalMem": 85e9}],
             "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}, "traceEvents": events}
    path.write_text(json.dumps(trace))


def test_command_fits_a_kineto_file(tmp_path, capsys):
    trace, out = tmp_path / "rank0.json", tmp_path / "fitted.yaml"
    kineto_file(trace)
    assert main(["calibrate", "--from-trace", str(trace), "--system", "dgx-a100", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "reading trace 1/1" in err and "held out" in err
    profile = CalibrationProfile.model_validate(yaml.safe_load(out.read_text()))
    fit = profile.compute.gemm_fits[0]
    assert fit.efficiency == pytest.approx(TRUE_GEMM.efficiency, rel=1e-2)
    assert profile.links.collectives[0].bandwidth == pytest.approx(TRUE_BANDWIDTH, rel=1e-2)


@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    ('{"traceEvents": 3}', "traceEvents"),
])
def test_command_refuses_a_bad_trace_with_one_line(tmp_path, capsys, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["calibrate", "--from-trace", str(bad), "--system", "dgx-a100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and words in err[-1] and str(bad) in err[-1]
    assert not any(line.startswith("Traceback") for line in err)


def test_command_needs_a_system_and_a_matching_accelerator(tmp_path, capsys):
    trace = tmp_path / "rank0.json"
    kineto_file(trace, device_name="NVIDIA A100-PG509-200")  # the 40 GB board; dgx-a100 has the 80 GB part
    assert main(["calibrate", "--from-trace", str(trace)]) == 2
    assert "--system" in capsys.readouterr().err
    assert main(["calibrate", "--from-trace", str(trace), "--system", "dgx-a100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error: ")]) == 1
    assert "a100_sxm_40gb" in err[-1] and "--accelerator" in err[-1]
    assert main(["calibrate", "--from-trace", str(trace), "--system", "dgx-a100", "--accelerator", "a100-sxm-40gb",
                 "-o", str(tmp_path / "p.yaml")]) == 0


def test_a_trace_profile_prices_the_host_at_the_pace_the_trace_launched():
    from dataclasses import replace

    from mpsim.cost.actions import CostModel
    from mpsim.resolve import resolve

    # the same kernels, launched by one thread 25 us apart in one profiled step
    base = synthetic_trace()
    kernels = tuple(replace(kernel, step=1, launch_s=25e-6 * index, launch_thread=1)
                    for index, kernel in enumerate(base.kernels))
    launch = _profile(replace(base, kernels=kernels)).profile.compute.launch
    assert launch.host_interval_s == pytest.approx(25e-6) and launch.host_interval_samples == len(kernels) - 1
    assert _profile().profile.compute.launch.host_interval_s is None  # no launches recorded: no pace

    scenario_file = SCENARIOS / "megatron_22b_8xa100.yaml"
    for profile, expected_s in ((_profile(replace(base, kernels=kernels)).profile, 25e-6), (_profile().profile, 0.0)):
        scenario = load_scenario(scenario_file, ["training.dtype=tf32"]).scenario
        scenario = scenario.model_copy(update={"calibration": profile})
        model = CostModel(scenario, resolve(scenario))
        assert model.host_launch_forward_s == model.host_launch_backward_s == pytest.approx(expected_s)


def test_forwards_and_backwards_are_launched_at_the_pace_of_their_own_threads():
    from dataclasses import replace

    from mpsim.cost.actions import CostModel
    from mpsim.resolve import resolve
    from mpsim.traces.host import launch_intervals_by_pass

    # the forward's kernels launched 60 us apart by the main thread; the backward's 20 us apart by
    # the autograd engine's thread, which runs them under its evaluate_function annotations
    base = synthetic_trace()
    half = len(base.kernels) // 2
    kernels = tuple(replace(kernel, step=1, launch_s=60e-6 * index, launch_thread=1) if index < half else
                    replace(kernel, step=1, launch_s=20e-6 * index, launch_thread=2,
                            op_names=("autograd::engine::evaluate_function: MmBackward0", "aten::mm"))
                    for index, kernel in enumerate(base.kernels))
    trace = replace(base, kernels=kernels)
    forward, backward = launch_intervals_by_pass(trace)
    assert len(forward) == half - 1 and len(backward) == len(kernels) - half - 1
    launch = _profile(trace).profile.compute.launch
    assert launch.host_interval_forward_s == pytest.approx(60e-6)
    assert launch.host_interval_backward_s == pytest.approx(20e-6)
    scenario = load_scenario(SCENARIOS / "megatron_22b_8xa100.yaml", ["training.dtype=tf32"]).scenario
    scenario = scenario.model_copy(update={"calibration": _profile(trace).profile})
    model = CostModel(scenario, resolve(scenario))
    assert (model.host_launch_forward_s, model.host_launch_backward_s) == pytest.approx((60e-6, 20e-6))


def test_inside_annotated_passes_the_pace_is_the_mean_interval_and_waits_between_passes_drop_out():
    """Two forward passes, each launching a kernel every 20 us but one launch 100 us late; between
    them the thread waits 5 ms. Inside the pass windows the pace is the mean (the sum a pass costs);
    the wait is no launch work. Without annotations the median stands in, wait and all."""
    from dataclasses import replace

    from mpsim.traces.host import launch_intervals_by_pass

    base = synthetic_trace()
    gaps = [20e-6] * 9 + [100e-6]  # one pass: ten intervals
    launches, clock = [], 0.0
    for pass_index in range(2):
        clock += 5e-3 if pass_index else 0.0
        launches.append(clock)
        for gap in gaps:
            clock += gap
            launches.append(clock)
    kernels = tuple(replace(kernel, step=1, launch_s=launches[index], launch_thread=1)
                    for index, kernel in enumerate(base.kernels[:len(launches)]))
    assert len(kernels) == len(launches) == 22
    windows = (CpuOp("Forward 0", -1e-6, launches[10] + 2e-6, 1), CpuOp("Forward 1", launches[11] - 1e-6,
                                                                           launches[21] - launches[11] + 2e-6, 1))
    annotated = replace(base, kernels=kernels, annotations=windows)
    inside, _ = launch_intervals_by_pass(annotated, within_passes=True)
    assert sorted(inside) == pytest.approx(sorted(gaps * 2))
    launch = _profile(annotated).profile.compute.launch
    assert launch.host_interval_statistic == "mean within passes"
    assert launch.host_interval_forward_s == pytest.approx(np.mean(gaps))  # 28 us, not the median's 20
    bare = _profile(replace(annotated, annotations=())).profile.compute.launch
    assert bare.host_interval_statistic == "median" and bare.host_interval_forward_s == pytest.approx(20e-6)


def test_a_kind_of_pass_without_windows_keeps_the_median_of_all_its_intervals():
    """Forwards annotated, backwards not (the autograd thread's launches, after the forward, fall
    in no window)."""
    from dataclasses import replace

    base = synthetic_trace()
    half = len(base.kernels) // 2
    kernels = tuple(replace(kernel, step=1, launch_s=60e-6 * index, launch_thread=1) if index < half else
                    replace(kernel, step=1, launch_s=60e-6 * half + 1e-3 + 20e-6 * (index - half), launch_thread=2,
                            op_names=("autograd::engine::evaluate_function: MmBackward0", "aten::mm"))
                    for index, kernel in enumerate(base.kernels))
    window = CpuOp("Forward 0", -1e-6, 60e-6 * (half - 1) + 2e-6, 1)
    launch = _profile(replace(base, kernels=kernels, annotations=(window,))).profile.compute.launch
    assert launch.host_interval_forward_s == pytest.approx(60e-6)
    assert launch.host_interval_backward_s == pytest.approx(20e-6)
    assert launch.host_interval_statistic == "forwards mean within passes, backwards median"
