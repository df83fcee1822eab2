"""``mpsim validate --trace``: a scenario's predicted step lined up with profiler traces.

The recorded traces (``tests/data/traces/cpu_pipeline_*``, rebuilt by
``tests/data/traces/record_cpu_pipeline.py``) are real Kineto exports of the validation
job on two CPU ranks; the constructed ones below have durations chosen so that the
expected numbers follow by hand.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from functools import cache

import pytest

from mpsim.cli import main
from mpsim.schedules.actions import Action
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.traces.compare import compare_traces
from mpsim.traces.compare_plot import plot_comparison
from mpsim.traces.compare_report import format_comparison
from mpsim.traces.read import load_traces
from mpsim.traces.model import Collective, CpuOp, Kernel, Step, Trace
from mpsim.traces.passes import measure_passes, parse_pass
from mpsim.traces.predicted import rank_categories
from tests.conftest import ROOT, SCENARIOS

DATA = ROOT / "tests" / "data" / "traces"
SCENARIO = str(SCENARIOS / "validation_2xcpu.yaml")


def recorded(schedule: str) -> list[str]:
    return [str(DATA / f"cpu_pipeline_{schedule}_rank{rank}.json.gz") for rank in (0, 1)]


@cache
def simulated(schedule: str, *overrides: str):
    loaded = load_scenario(SCENARIO, [f"parallel.schedule={schedule}", *overrides])
    return simulate(loaded.scenario, loaded.path.parent)


def test_annotation_names_parse_as_torch_writes_them():
    assert parse_pass("PP:1F0").item == Action(1, "F", 0)
    assert parse_pass("PP:0W12").item == Action(0, "W", 12)
    pair = parse_pass("PP:(0F3;7B1)OVERLAP_F_B")
    assert str(pair.item) == "(0F3;7B1)OVERLAP_F_B" and pair.kind == "F&B"
    single = parse_pass("Backward 2")
    assert single.item is None and (single.kind, single.microbatch) == ("B", 2)
    for name in ("PP:1RECV_F0", "PP:0SEND_B2", "PP:0UNSHARD", "ProfilerStep#3", "gloo:recv", "Forward"):
        assert parse_pass(name) is None


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_recorded_cpu_trace_has_every_pass_of_the_schedule(schedule):
    result = simulated(schedule)
    traces = load_traces(recorded(schedule), cpu_only=True)
    assert [t.rank for t in traces] == [0, 1] and all(not t.kernels for t in traces)
    for rank, trace in enumerate(traces):
        expected = Counter(action.kind for action in result.schedule.actions[rank])
        passes = measure_passes(trace)
        steps = sorted({p.step for p in passes})
        assert steps == [s.number for s in trace.steps] and len(steps) == 3
        for step in steps:
            assert Counter(p.parsed.kind for p in passes if p.step == step) == expected
        for p in passes:
            assert 0 <= p.wait_s and 0 < p.busy_s <= p.end_s - p.start_s + 1e-12
            assert p.busy_s + p.wait_s == pytest.approx(p.end_s - p.start_s)
    comparison = compare_traces(traces, result)
    assert comparison.mode == "passes"
    for rank in (0, 1):
        rows = [row for row in comparison.passes if row.rank == rank]
        assert [row.label for row in rows] == [str(a) for a in result.schedule.actions[rank]]
        assert all(row.steps == 3 and row.measured_s > 0 for row in rows)


def test_recorded_input_waits_are_found():
    """The first stage never waits for an input to its forwards; the second waits for its first one."""
    first, second = (measure_passes(t) for t in load_traces(recorded("1f1b"), cpu_only=True))
    assert all(p.wait_s == 0 for p in first if p.parsed.kind == "F")
    assert all(p.wait_s > 0 for p in second if p.name == "PP:1F0")


def _annotation(name: str, start_s: float, duration_s: float) -> CpuOp:
    return CpuOp(name=name, start_s=start_s, duration_s=duration_s, thread=1)


def _cpu_trace(rank: int, step_passes: list[list[tuple[str, float]]]) -> Trace:
    """A CPU-only trace whose steps run the named passes back to back, each for its seconds."""
    annotations, steps, clock = [], [], 0.0
    for number, passes in enumerate(step_passes, start=1):
        start = clock
        for name, seconds in passes:
            annotations.append(_annotation(name, clock, seconds))
            clock += seconds
        steps.append(Step(number, start, clock))
        annotations.append(_annotation(f"ProfilerStep#{number}", start, clock - start))
    return Trace(f"rank{rank}.json", None, None, None, None, rank, 2, (), tuple(steps),
                 tuple(sorted(annotations, key=lambda a: a.start_s)))


def test_per_pass_errors_on_a_constructed_trace():
    """Forwards measured 1.25x their prediction and backwards 0.8x (median of three steps)."""
    result = simulated("1f1b")
    traces = []
    for rank in (0, 1):
        records = result.timeline.actions[rank]
        scales = [{"F": 1.25, "B": 0.8}, {"F": 2.0, "B": 0.5}, {"F": 1.0, "B": 1.0}]  # the median is the first
        traces.append(_cpu_trace(rank, [[(f"PP:{r.action}", (r.end_s - r.start_s) * scale[r.action.kind])
                                         for r in records] for scale in scales]))
    comparison = compare_traces(traces, result)
    assert comparison.mode == "passes" and len(comparison.passes) == 16
    for row in comparison.passes:
        assert row.error_pct == pytest.approx(-20.0 if row.kind == "F" else 25.0)
    # the step: three steps of the slowest rank, each the sum of its passes
    spans = sorted(max(s.end_s - s.start_s for s in (t.steps[i] for t in traces)) for i in range(3))
    assert comparison.measured_step_s == pytest.approx(spans[1])
    text = format_comparison(comparison)
    assert "mode         passes" in text and "-20.0%" in text and "+25.0%" in text


def test_stageless_annotations_take_the_rank_of_distributed_info():
    result = simulated("gpipe")
    traces = [_cpu_trace(rank, [[(f"{'Forward' if r.action.kind == 'F' else 'Backward'} {r.action.microbatch}",
                                  2 * (r.end_s - r.start_s)) for r in result.timeline.actions[rank]]])
              for rank in (1, 0)]
    comparison = compare_traces(traces, result)
    assert list(comparison.traces) == [0, 1]
    assert {row.label[0] for row in comparison.passes if row.rank == 1} == {"1"}
    assert all(row.error_pct == pytest.approx(-50.0) for row in comparison.passes)


@pytest.mark.parametrize("schedule, overrides", [("zb-h1", ()), ("dualpipev", ("parallel.vpp=2",))])
def test_split_and_overlapped_passes_line_up(schedule, overrides):
    """Every pass measured twice its prediction; the first stage's I and W compare as one I+W."""
    result = simulated(schedule, *overrides)
    traces = [_cpu_trace(rank, [[(f"PP:{r.action}", 2 * (r.end_s - r.start_s)) for r in result.timeline.actions[rank]]])
              for rank in (0, 1)]
    comparison = compare_traces(traces, result)
    assert comparison.passes and all(row.error_pct == pytest.approx(-50.0) for row in comparison.passes)
    kinds = Counter(row.kind for row in comparison.passes)
    if schedule == "zb-h1":
        assert kinds["I+W"] == 4 and kinds["I"] == kinds["W"] == 4  # stage 0 merged, stage 1 split
    else:
        assert kinds["F&B"] > 0


def _kernel(name: str, category: str, start_s: float, duration_s: float, step: int, callers=(), kind=None) -> Kernel:
    collective = Collective(kind, 1 << 20, 2, None, None) if kind else None
    return Kernel(name, category, start_s, duration_s, 7, None, None, tuple(callers), step, None, collective)


def test_gpu_pass_is_the_union_of_its_kernels_without_point_to_point():
    annotations = (_annotation("ProfilerStep#1", 0.0, 1.0), _annotation("PP:0F0", 0.1, 0.2))
    kernels = (_kernel("gemm_a", "gemm", 0.30, 0.02, 1, ("ProfilerStep#1", "PP:0F0")),
               _kernel("gemm_b", "gemm", 0.31, 0.02, 1, ("ProfilerStep#1", "PP:0F0")),  # overlaps the first
               _kernel("nccl_recv", "collective", 0.25, 0.5, 1, ("ProfilerStep#1", "PP:0F0"), "send-recv"),
               _kernel("elementwise", "elementwise", 0.40, 0.01, 1, ("ProfilerStep#1",)))  # outside the pass
    # launched from the autograd engine's thread by an op that started inside the pass
    engine_op = CpuOp("aten::mm", 0.25, 0.01, thread=2)
    kernels += (Kernel("gemm_c", "gemm", 0.50, 0.01, 7, None, engine_op, ("aten::mm",), 1),)
    trace = Trace("gpu.json", "GPU", None, None, None, 0, 2, kernels, (Step(1, 0.0, 1.0),), annotations)
    (only,) = measure_passes(trace)
    assert only.busy_s == pytest.approx(0.04) and only.wait_s == 0
    assert len(only.spans) == 2 and only.spans[0] == pytest.approx((0.30, 0.33))
    # its time on the GPU runs from its first kernel to its last, the gap between them included
    assert only.elapsed_s == pytest.approx(0.21)


def test_category_mode_on_a_constructed_gpu_trace():
    result = simulated("1f1b")
    steps = (Step(1, 0.0, 1.0), Step(2, 1.0, 2.0), Step(3, 2.0, 3.0))
    kernels = []
    for step, gemm_s in zip((1, 2, 3), (0.2, 0.3, 0.5)):
        base = step - 1.0
        kernels += [_kernel("sm90_gemm", "gemm", base, gemm_s, step),
                    _kernel("vectorized_elementwise", "elementwise", base + 0.6, 0.1, step),
                    _kernel("ncclAllReduce", "collective", base + 0.8, 0.05, step, kind="all-reduce")]
    annotations = tuple(_annotation(f"ProfilerStep#{s.number}", s.start_s, 1.0) for s in steps)
    trace = Trace("gpu.json", "GPU", None, None, None, 0, 2, tuple(kernels), steps, annotations)
    comparison = compare_traces([trace], result)
    assert comparison.mode == "categories" and "no microbatch pass annotations" in comparison.why
    rows = {row.category: row for row in comparison.categories}
    assert rows["gemm"].measured_s == pytest.approx(0.3)  # median of 0.2, 0.3, 0.5
    assert rows["elementwise"].measured_s == pytest.approx(0.1)
    assert rows["collective:all-reduce"].measured_s == pytest.approx(0.05)
    assert rows["gemm"].predicted_s > 0 and rows["attention"].predicted_s > 0
    assert "mode         categories" in format_comparison(comparison)


def test_predicted_categories_add_up_to_the_compute_of_each_rank():
    """Every compute segment gets a category: their sum is the ranks' action time plus the optimizer."""
    result = simulated("1f1b")
    for rank, categories in enumerate(rank_categories(result)):
        compute = sum(s for c, s in categories.items() if not c.startswith("collective:"))
        actions = sum(r.end_s - r.start_s for r in result.timeline.actions[rank])
        optimizer = sum(s.end_s - s.start_s for s in result.timeline.syncs_of(rank) if s.kind == "optimizer")
        assert compute == pytest.approx(actions + optimizer)
        assert categories.get("other", 0.0) == 0.0  # no calibration: no per-action overhead
        assert categories["gemm"] > categories["attention"] > 0


def test_category_plot_is_written(tmp_path):
    """Pass mode is drawn by the command-line test below; this draws the kernel categories."""
    # the trace ran on the 40 GB board (A100-PG509-200): the scenario names that part
    loaded = load_scenario(str(SCENARIOS / "vit_h14_32xa100.yaml"), [
        "cluster.nodes=null", "cluster.num_devices=2", "parallel.global_batch_size=64",
        "cluster.system.accelerator=a100-sxm-40gb"])
    comparison = compare_traces(load_traces([str(DATA / "cnn_allreduce_step5.json.gz")], cpu_only=True),
                                simulate(loaded.scenario, loaded.path.parent))
    assert comparison.mode == "categories"
    path = tmp_path / "compare.png"
    plot_comparison(comparison, str(path))
    assert path.stat().st_size > 10_000


def test_cli_prints_the_comparison_and_draws_it(tmp_path, capsys):
    path = tmp_path / "timelines.png"
    assert main(["validate", "--trace", *recorded("1f1b"), SCENARIO, "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mode         passes" in out and "1B3" in out and out.strip().splitlines()[-1].startswith("mode=passes ")
    assert path.stat().st_size > 10_000
    # the scenario may come first, and --set reaches it
    assert main(["validate", SCENARIO, "--set", "parallel.schedule=gpipe", "--trace", *recorded("gpipe")]) == 0
    assert "gpipe, pp 2" in capsys.readouterr().out


def test_cli_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from mpsim.cli import main\n"
            f"sys.exit(main(['validate', '--trace', {recorded('1f1b')[0]!r}, {recorded('1f1b')[1]!r}, {SCENARIO!r}]))")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "mode=passes" in done.stdout


def _write(path, events, **top) -> str:
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events, **top}, handle)
    return str(path)


def _bad_traces(tmp_path) -> dict[str, list[str]]:
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1}
    stage5 = dict(step, name="PP:5F0", ts=10, dur=5)
    empty = dict(step, name="something else", ts=10, dur=5)
    not_json = tmp_path / "broken.json"
    not_json.write_text("{not json")
    return {
        "not JSON": [str(not_json)],
        "stage 5": [_write(tmp_path / "stage5.json.gz", [step, stage5])],
        "nothing to compare": [_write(tmp_path / "empty.json.gz", [step, empty],
                                      distributedInfo={"rank": 0, "world_size": 2})],
        "world size": [_write(tmp_path / "world.json.gz", [step, empty], distributedInfo={"rank": 0, "world_size": 8})],
        "both pipeline rank 0": [recorded("1f1b")[0], recorded("gpipe")[0]],
        "no events": [_write(tmp_path / "none.json.gz", [])],
    }


def test_bad_traces_exit_2_with_one_line(tmp_path, capsys):
    for problem, paths in _bad_traces(tmp_path).items():
        assert main(["validate", "--trace", *paths, SCENARIO]) == 2, problem
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1, (problem, err)
    assert main(["validate", "--trace", recorded("1f1b")[0]]) == 2  # no scenario after the traces
    assert "give the scenario after the traces" in capsys.readouterr().err
    assert main(["validate", "--trace", *recorded("1f1b"), SCENARIO, "--out", str(tmp_path / "p.yaml")]) == 2
    assert main(["validate", SCENARIO]) == 2  # a scenario argument without --trace
    capsys.readouterr()


def test_trace_of_another_device_is_refused(capsys):
    # the extract ran on the 40 GB A100 board; the scenario's system has the 80 GB part
    extract = str(DATA / "cnn_allreduce_step5.json.gz")
    vit = str(SCENARIOS / "vit_h14_32xa100.yaml")
    assert main(["validate", "--trace", extract, vit, "--set", "cluster.nodes=null", "--set", "cluster.num_devices=2",
                 "--set", "parallel.global_batch_size=64"]) == 2
    err = capsys.readouterr().err
    assert "the trace ran on 'NVIDIA A100-PG509-200', which the scenario's accelerator a100-sxm-80gb" in err


def test_trace_of_another_schedule_is_refused():
    """A zero-bubble scenario's rank 1 runs I and W, not the B the 1F1B trace recorded."""
    with pytest.raises(Exception) as caught:
        compare_traces(load_traces(recorded("1f1b"), cpu_only=True), simulated("zb-h1"))
    assert "runs no 1B0" in str(caught.value) or "runs no 0B0" in str(caught.value)


def test_category_mode_on_a_real_gpu_extract(capsys):
    """The 2-rank A100 CNN extract (no pass annotations) against ViT-H/14 on 2 A100 of its board
    (the 40 GB part): categories."""
    extract = str(DATA / "cnn_allreduce_step5.json.gz")
    vit = str(SCENARIOS / "vit_h14_32xa100.yaml")
    assert main(["validate", "--trace", extract, vit, "--set", "cluster.nodes=null", "--set", "cluster.num_devices=2",
                 "--set", "parallel.global_batch_size=64", "--set", "cluster.system.accelerator=a100-sxm-40gb"]) == 0
    out = capsys.readouterr().out
    assert "mode         categories: no microbatch pass annotations" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("   0  ")}
    assert float(rows["collective:all-reduce"][2]) > 0 and float(rows["convolution"][2]) > 0
    assert float(rows["gemm"][3]) > 0 and float(rows["convolution"][3]) > 0


def test_a_gpu_pass_is_compared_by_its_time_on_the_gpu_gaps_included():
    """Each pass's two kernels fill half of it, the GPU waiting between them (a host that launches
    slower than the GPU runs): the pass's measured time is its whole extent, which is what a
    simulated action's duration stands for, so a trace made from the simulation matches it."""
    result = simulated("1f1b")
    traces = []
    for rank in (0, 1):
        annotations, kernels, clock = [], [], 0.0
        for number in (1, 2, 3):
            start = clock
            for record in result.timeline.actions[rank]:
                name, duration = f"PP:{record.action}", record.end_s - record.start_s
                annotations.append(_annotation(name, clock, duration))
                for offset in (0.0, 0.75):
                    kernels.append(_kernel("gemm", "gemm", clock + offset * duration, duration / 4, number,
                                           (f"ProfilerStep#{number}", name)))
                clock += duration
            annotations.append(_annotation(f"ProfilerStep#{number}", start, clock - start))
        steps = tuple(Step(n, a.start_s, a.start_s + a.duration_s) for n, a in
                      ((int(a.name.split("#")[1]), a) for a in annotations if a.name.startswith("ProfilerStep")))
        traces.append(Trace(f"rank{rank}.json", "GPU", None, None, None, rank, 2, tuple(kernels), steps,
                            tuple(sorted(annotations, key=lambda a: a.start_s))))
    comparison = compare_traces(traces, result)
    assert comparison.mode == "passes" and len(comparison.passes) == 16
    for row in comparison.passes:
        assert row.error_pct == pytest.approx(0.0, abs=1e-6)
    busy = [p.busy_s / p.elapsed_s for p in measure_passes(traces[0])]
    assert all(share == pytest.approx(0.5) for share in busy)  # the kernels' union is half of it
