"""The host's kernel launches: a pass cannot run faster than its kernels are launched, and
after a synchronisation its first kernels wait for the host; the launch pace is measured
on real traces."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.traces import load_trace
from mpsim.traces.host import launch_intervals_s, starved_share
from mpsim.workload import build_workload
from mpsim.workload.ops import Overlap
from tests.conftest import SCENARIOS

LLAMA8 = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
# a model small enough that its kernels last a few microseconds on an H100
SMALL = ("model.num_layers=2", "model.hidden_size=256", "model.ffn_hidden_size=512", "model.num_attention_heads=4",
         "model.num_query_groups=4", "model.seq_length=256", "model.vocab_size=1024", "parallel.microbatch_size=1", "parallel.tp=1",
         "parallel.dp=64")
TRACES = Path(__file__).parent / "data" / "traces"


def forward_cost(*overrides: str):
    scenario = load_scenario(LLAMA8, list(overrides)).scenario
    layout = resolve(scenario)
    return CostModel(scenario, layout).price(build_workload(scenario, layout).stages[0].forward)


def launches(*overrides: str) -> int:
    """Kernels the host launches for the forward of ``forward_cost``: one per collective and
    as many as each op names (an eager cross entropy is several kernels)."""
    scenario = load_scenario(LLAMA8, list(overrides)).scenario
    count = 0
    for block in build_workload(scenario, resolve(scenario)).stages[0].forward:
        for item in block.items:
            if isinstance(item, Overlap):
                count += 1 + sum(op.launches for op in item.compute)
            else:
                count += 1 if item.kind == "collective" else item.launches
    return count


def test_no_host_time_leaves_the_gpu_schedule_as_it_was():
    for sync in ("true", "false"):
        cost = forward_cost(*SMALL, "training.host_launch_interval=0 s", f"training.host_sync_between_passes={sync}")
        assert cost.host_wait_s == 0.0
        ops = sum(seg.duration_s for seg in cost.segments if seg.stream == "compute")
        assert cost.duration_s == pytest.approx(ops, rel=1e-12)


def test_a_pass_of_short_kernels_runs_at_the_hosts_pace():
    host_s = 1e-3  # longer than any kernel of the small model
    cold = forward_cost(*SMALL, "training.host_launch_interval=1 ms", "training.host_sync_between_passes=true")
    warm = forward_cost(*SMALL, "training.host_launch_interval=1 ms")
    n = launches(*SMALL)
    assert n > 10
    # after a synchronisation kernel i starts when the host has launched it, i x host_s
    last = cold.segments[-1]
    assert last.offset_s == pytest.approx(n * host_s, rel=1e-9)
    assert cold.duration_s == pytest.approx(n * host_s + last.duration_s, rel=1e-9)
    # a host that runs ahead still cannot launch the pass faster than n x host_s
    assert warm.duration_s == pytest.approx(n * host_s, rel=1e-9)
    assert cold.host_wait_s == pytest.approx(cold.duration_s - cold.compute_s, rel=1e-9)


@pytest.mark.parametrize("sync", ["true", "false"])
def test_a_slower_host_is_never_faster(sync):
    durations = [forward_cost(*SMALL, f"training.host_launch_interval={us} us",
                              f"training.host_sync_between_passes={sync}").duration_s
                 for us in (0, 2, 10, 29, 100, 1000)]
    assert durations == sorted(durations)
    assert durations[-1] > durations[0]


def test_long_kernels_hide_the_host_unless_the_pass_starts_on_an_empty_queue():
    gpu_only = forward_cost("training.host_launch_interval=0 s")
    warm = forward_cost()
    cold = forward_cost("training.host_sync_between_passes=true")
    host_s = load_scenario(LLAMA8).scenario.training.host_launch_interval
    assert warm.duration_s == gpu_only.duration_s  # Llama 3 8B's kernels outlast their launches
    # only the wait for the first launches shows, a small part of the pass
    assert host_s <= cold.host_wait_s < 0.01 * cold.duration_s
    assert cold.duration_s == pytest.approx(gpu_only.duration_s + cold.host_wait_s, rel=1e-9)


def test_a_synchronised_pipeline_step_is_slower_by_its_waits():
    base = (*SMALL, "parallel.pp=2", "parallel.dp=32", "parallel.schedule=1f1b")
    free = simulate(load_scenario(LLAMA8, [*base]).scenario).timeline.step_time_s
    synced = simulate(load_scenario(LLAMA8, [*base, "training.host_sync_between_passes=true"]).scenario)
    assert synced.timeline.step_time_s > free


def test_a_negative_launch_interval_is_refused():
    from mpsim.errors import InputError
    with pytest.raises(InputError, match="host_launch_interval"):
        load_scenario(LLAMA8, ["training.host_launch_interval=-1 us"])


# --- measured on traces -----------------------------------------------------------------------------------------

def raw_launch_intervals(path: Path) -> list[float]:
    """Intervals between the CUDA runtime calls that launched the step's kernels, per thread, from the raw JSON."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    kernels = {e["args"]["correlation"] for e in events
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and isinstance((e.get("args") or {}).get("correlation"), int)}
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    by_thread: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and \
                (e.get("args") or {}).get("correlation") in kernels and \
                any(start <= e["ts"] <= end for start, end in steps):
            by_thread.setdefault(e["tid"], []).append(e["ts"] * 1e-6)
    intervals = []
    for times in by_thread.values():
        times.sort()
        intervals += [b - a for a, b in zip(times, times[1:])]
    return intervals


@pytest.mark.parametrize("name", ["recsys8_step1010.json.gz", "cnn_allreduce_step5.json.gz"])
def test_launch_intervals_are_the_runtime_calls_of_each_thread(name):
    trace = load_trace(str(TRACES / name))
    measured = launch_intervals_s(trace)
    expected = raw_launch_intervals(TRACES / name)
    assert len(measured) == len(expected) > 50
    assert statistics.median(measured) == pytest.approx(statistics.median(expected), abs=1e-7)  # Kineto: 0.1 us
    assert 0.0 <= starved_share(trace) <= 1.0


def test_the_cnn_step_waited_for_its_host_more_than_the_recommender():
    # read off the two runs: the CNN launches many short kernels from Python, so most of them
    # start as soon as they are launched; the recommender's GPU mostly had work queued
    cnn = starved_share(load_trace(str(TRACES / "cnn_allreduce_step5.json.gz")))
    recsys = starved_share(load_trace(str(TRACES / "recsys16_step551.json.gz")))
    assert cnn > 0.5 > recsys


def test_plain_pytorch_attention_launches_the_kernels_its_trace_shows_and_the_host_pays_each():
    """PyTorch's fused attention launches a memset beside its kernel (forward) and three kernels
    (backward), and autograd stacks and copies the packed q/k/v gradients: 2 and 6 launches per
    layer, where Megatron's own layers count one. A launch-bound pass costs one host interval
    per launch."""
    from mpsim.cost.actions import CostModel
    from mpsim.resolve import resolve
    from mpsim.simulate import simulate
    from mpsim.specs import load_scenario
    from mpsim.workload.ops import Overlap
    from tests.conftest import SCENARIOS

    def stage(overrides):
        scenario = load_scenario(SCENARIOS / "validation_2xcpu.yaml", overrides).scenario
        return scenario, simulate(scenario).workload.stages[0]

    def ops(passes):
        return [op for block in passes for item in block.items
                for op in (item.compute if isinstance(item, Overlap) else (item,))]

    interval = 0.01  # far longer than any op of this model: every pass is launch-bound
    scenario, work = stage([f"training.host_launch_interval={interval}"])
    assert scenario.training.layers_impl == "pytorch"
    assert {op.launches for op in ops(work.forward) if op.name == "attn.flash"} == {2}
    assert {op.launches for op in ops(work.backward) if op.name == "attn.flash.grad"} == {6}
    _, local = stage([f"training.host_launch_interval={interval}", "training.transformer_impl=local"])
    assert {op.launches for op in ops(local.forward) + ops(local.backward) if op.name.startswith("attn.flash")} == {1}
    model = CostModel(scenario, resolve(scenario))
    for passes in (work.forward, work.backward):
        launches = sum(op.launches for op in ops(passes))
        assert launches > len(ops(passes))
        assert model.price(passes).duration_s == pytest.approx(launches * interval, rel=0.02)
