"""Step-to-step kernel variation from a trace, and the published figures it gives the reliability model."""

from __future__ import annotations

import json

import pytest

from mpsim.cli import main
from mpsim.errors import InputError
from mpsim.reliability.op_variation import PUBLISHED_CV, op_cvs
from mpsim.specs import load_scenario
from mpsim.traces.model import Kernel, Step, Trace
from mpsim.traces.variation import kind_variation, weighted_median
from tests.conftest import SCENARIOS, load_benchmark


def _trace(durations_by_name: dict[str, list[list[float]]]) -> Trace:
    """A trace whose step s launches, for each name, the kernels durations_by_name[name][s] in order."""
    kernels = []
    steps = len(next(iter(durations_by_name.values())))
    clock = 0.0
    for step in range(steps):
        for name, per_step in durations_by_name.items():
            category = "collective" if name.startswith("nccl") else "gemm" if "gemm" in name else "elementwise"
            for seconds in per_step[step]:
                kernels.append(Kernel(name, category, clock, seconds, 7, None, step=step))
                clock += seconds
    return Trace("constructed", "NVIDIA A100-SXM4-80GB", 108, None, None, None, None, tuple(kernels),
                 tuple(Step(s, 0.0, 0.0) for s in range(steps)))


def test_cv_of_one_kernel_over_three_steps():
    # 1, 2, 3 s: mean 2, sample standard deviation 1
    result = kind_variation([_trace({"gemm_a": [[1.0], [2.0], [3.0]]})])
    assert result["gemm"].cv == pytest.approx(0.5)
    assert (result["gemm"].groups, result["gemm"].kernels) == (1, 3)


def test_positions_pair_up_within_a_name_and_unequal_counts_are_left_out():
    trace = _trace({
        "gemm_a": [[1.0, 10.0], [1.0, 10.0], [1.0, 10.0]],  # two positions, each constant: no variation
        "vectorized_add": [[1.0], [1.0, 1.0], [1.0]],  # launched twice in one step: cannot pair up
        "ncclKernel_AllReduce": [[2.0], [4.0], [6.0]],
    })
    result = kind_variation([trace])
    assert result["gemm"].cv == 0.0 and result["gemm"].groups == 2
    assert "memory" not in result
    assert result["collective"].cv == pytest.approx(0.5)


def test_fewer_than_three_steps_give_nothing():
    assert kind_variation([_trace({"gemm_a": [[1.0], [2.0]]})]) == {}


def test_weighted_median_follows_the_time():
    # the long kernel's variation decides: 0.3 carries 10 of 12 units of time
    assert weighted_median([0.1, 0.3, 0.9], [1.0, 10.0, 1.0]) == 0.3
    assert weighted_median([0.1, 0.2], [1.0, 1.0]) == 0.1


def test_an_a100_scenario_takes_the_published_figures_and_must_give_the_others():
    loaded = load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml",
                           ["variability.cv.attention=0.03", "variability.cv.collective=0.05",
                            "variability.cv.transfer=0.05"])
    scenario = loaded.scenario
    accelerator = scenario.cluster.system.accelerator.name
    assert accelerator in PUBLISHED_CV
    cvs = op_cvs(scenario)
    assert cvs["gemm"] == PUBLISHED_CV[accelerator]["gemm"]
    assert cvs["memory"] == PUBLISHED_CV[accelerator]["memory"]
    bare = load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml").scenario
    with pytest.raises(InputError, match="attention, collective, transfer"):
        op_cvs(bare)


def _kineto(tmp_path, gemm_us: list[float]) -> str:
    """A Kineto JSON of len(gemm_us) ProfilerSteps, each launching one GEMM kernel of that many microseconds."""
    events, correlation = [], 1
    for step, duration in enumerate(gemm_us):
        start = 1000.0 * step
        events.append({"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": start, "dur": 900.0})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": start + 10, "dur": 5.0, "args": {"correlation": correlation}})
        events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
                       "ts": start + 20, "dur": duration,
                       "args": {"correlation": correlation, "stream": 7, "device": 0}})
        correlation += 1
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
                                "traceEvents": events}))
    return str(path)


def test_trace_variation_prints_the_overrides(tmp_path, capsys):
    assert main(["trace", "variation", _kineto(tmp_path, [100.0, 110.0, 120.0])]) == 0
    out = capsys.readouterr().out
    # 100, 110, 120 us: mean 110, sample standard deviation 10
    assert f"--set variability.cv.gemm={10 / 110:.4f}" in out


def test_trace_variation_needs_three_steps(tmp_path, capsys):
    assert main(["trace", "variation", _kineto(tmp_path, [100.0, 110.0])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "record more steps" in err


def test_the_benchmark_reads_a_gemm_calls_host_time(tmp_path):
    module = load_benchmark("trace_variation")
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "ts": 0, "dur": dur}
              for name, dur in (("aten::mm", 30.0), ("aten::addmm", 45.0), ("aten::mul", 9.0))]
    events.append({"ph": "X", "cat": "kernel", "name": "aten::mm", "ts": 0, "dur": 500.0})  # a GPU event: not host time
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert module.gemm_call_durations_us(str(path)) == [30.0, 45.0]
