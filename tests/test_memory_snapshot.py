"""PyTorch's own memory tools read mpsim's snapshots and agree with mpsim's memory table.

Every shipped scenario is simulated once (cached for the module); the snapshots of its
first rank, its busiest rank and its last rank go through ``torch.cuda._memory_viz``:
``segsum`` (what ``python -m torch.cuda._memory_viz stats`` prints), ``trace`` and
``segments`` (its flame-graph input, with the flame-graph step replaced by the identity
so nothing is downloaded). The tools print sizes rounded to one decimal of a unit; the
tests make them print exact bytes (``_format_size``), so the numbers read back are the
tools' own sums, not approximations.

The peak the tools show is the memory allocated before the recording (active blocks at
the end of the step that no recorded ``alloc`` accounts for: the viewer's reading) plus
the highest running total of the recorded allocations. mpsim predicts
``peak_memory_bytes - fragmentation_bytes`` for it (the snapshot shows the allocator
model's free space instead of mpsim's fragmentation allowance). Tolerance: the snapshot
holds whole bytes and mpsim's sizes are floats, so each allocation differs by at most
half a byte from mpsim's; half a byte per allocation in the snapshot (resident blocks
plus recorded allocations) plus one byte for the float sums bounds the difference.
"""

from __future__ import annotations

import functools
import re

import pytest

from mpsim.results.memory import rank_memory
from mpsim.results.memory_snapshot import memory_snapshot
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

viz = pytest.importorskip("torch.cuda._memory_viz")

SCENARIO_FILES = sorted(SCENARIOS.glob("*.yaml"))
LLAMA8 = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
FSDP_HELD = ("parallel.tp=1", "parallel.pp=1", "parallel.dp=16", "parallel.sequence_parallel=false",
             "cluster.nodes=2", "parallel.global_batch_size=32", "parallel.zero_stage=3",
             "parallel.recompute=full", "parallel.reshard_after_forward=false")
VARIANTS = {  # paths the shipped scenarios do not take
    "zb-h1, weight-gradient buffers held from I to W": (SCENARIOS / "megatron_22b_8xa100.yaml",
                                                         ("parallel.schedule=zb-h1",)),
    # GPipe holds all 16 microbatches' activations before the first backward
    "gpipe out of memory": (SCENARIOS / "llama3_70b_32xh100.yaml", ("parallel.schedule=gpipe",)),
    "ZeRO-3 parameters held from forward to backward": (LLAMA8, FSDP_HELD),
    "fragmentation allowance": (SCENARIOS / "megatron_22b_8xa100.yaml", ("training.memory_fragmentation=0.1",)),
    # each chunk gathered at the start, freed by its forwards, gathered and kept by its backwards
    "FSDP resharding under an interleaved pipeline": (
        SCENARIOS / "llama3_70b_32xh100.yaml",
        ("parallel.tp=4", "parallel.recompute=full", "parallel.zero_stage=3", "parallel.reshard_after_forward=true",
         "parallel.schedule=interleaved-1f1b", "parallel.vpp=2")),
    # pairs of a forward that frees its chunk and a backward that gathers its own
    "FSDP resharding under DualPipeV": (
        SCENARIOS / "llama3_70b_32xh100.yaml",
        ("parallel.tp=4", "parallel.recompute=full", "parallel.zero_stage=3", "parallel.reshard_after_forward=true",
         "parallel.schedule=dualpipev", "parallel.vpp=2")),
    # torch's runtime keeps 3 of a rank's 5 chunks gathered: chunks freed and gathered again between passes
    "FSDP chunk window, parameters kept from forward to backward": (
        SCENARIOS / "llama3_70b_32xh100.yaml",
        ("parallel.zero_stage=3", "parallel.reshard_after_forward=false", "parallel.schedule=interleaved-1f1b",
         "parallel.vpp=5", "parallel.fsdp_gathered_chunks=3")),
    "FSDP chunk window, resharding after the forward": (
        SCENARIOS / "llama3_70b_32xh100.yaml",
        ("parallel.zero_stage=3", "parallel.reshard_after_forward=true", "parallel.schedule=interleaved-1f1b",
         "parallel.vpp=5", "parallel.fsdp_gathered_chunks=3")),
}


@functools.cache
def simulated(path, overrides=()):
    loaded = load_scenario(path, list(overrides))
    result = simulate(loaded.scenario, loaded.path.parent if loaded.path else None)
    return result, rank_memory(result.scenario, result.layout, result.schedule, result.workload)


def snapshot_ranks(memory) -> list[int]:
    busiest = max(range(len(memory)), key=lambda rank: memory[rank].peak_memory_bytes)
    return sorted({0, busiest, len(memory) - 1})


@pytest.fixture
def exact_bytes(monkeypatch):
    """The tools print every size as a whole number of bytes."""
    monkeypatch.setattr(viz, "_format_size", lambda num: f"{num}B")


def read_stats(snapshot) -> dict[str, int]:
    text = viz.segsum(snapshot)  # raises on a segment whose blocks do not add up to it
    found = {key: int(re.search(rf"^{key}: (\d+)B?", text, re.MULTILINE).group(1))
             for key in ("segments", "total_reserved", "total_allocated")}
    return found


def read_trace(snapshot) -> dict:
    """What the tool's trace says: allocations, frees, their running total and oom events."""
    lines = viz.trace(snapshot).splitlines()
    live: dict[str, int] = {}
    running = peak = allocs = frees = ooms = 0
    outside = []
    for line in lines:
        if match := re.fullmatch(r"(\w+) = (\w+)\[(\d+):(\d+)B\]", line):
            name, segment, size = match.group(1), match.group(2), int(match.group(4))
            if segment == "MEM":  # the tool found no segment holding the address
                outside.append(line)
            live[name] = size
            running += size
            peak = max(peak, running)
            allocs += 1
        elif match := re.fullmatch(r"# free completed for (\S+) (\d+)B", line):
            name, size = match.group(1), int(match.group(2))
            assert live.pop(name, None) == size, f"free of an address the trace never allocated: {line}"
            running -= size
            frees += 1
        elif line.startswith("raise OutOfMemoryError"):
            ooms += 1
    return {"peak": peak, "final": running, "allocs": allocs, "frees": frees, "ooms": ooms, "live": live,
            "outside": outside}


def read_segments(snapshot) -> dict[str, int]:
    """Bytes per block state in the flame-graph input of ``segments`` (rounding inside blocks: ``<gaps>``)."""
    totals: dict[str, int] = {}
    for line in viz.segments(snapshot, format_flamegraph=lambda folded: folded).splitlines():
        stack, size = line.rsplit(" ", 1)
        state = "<gaps>" if stack.endswith(";<gaps>") else stack.split(";")[2]
        totals[state] = totals.get(state, 0) + int(size)
    return totals


def check_rank(result, memory, rank) -> None:
    m = memory[rank]
    snapshot = memory_snapshot(result, memory, rank)
    stats = read_stats(snapshot)
    trace = read_trace(snapshot)
    folded = read_segments(snapshot)
    where = f"{result.scenario.name} rank {rank}"

    # the allocator's shape: no segment larger than the device, blocks that tile their segment
    for segment in snapshot["segments"]:
        assert segment["total_size"] <= m.capacity_bytes, where
        addresses = [block["address"] for block in segment["blocks"]]
        ends = [block["address"] + block["size"] for block in segment["blocks"]]
        assert addresses[0] == segment["address"] and addresses[1:] == ends[:-1], where
    assert sum(folded.values()) == stats["total_reserved"], where

    # every recorded allocation lies in a segment and is freed at its own address within the step
    assert trace["outside"] == [], where
    assert trace["allocs"] == trace["frees"] and trace["final"] == 0 and not trace["live"], where
    # so what is allocated at the end is what was there before the recording: mpsim's resident memory
    resident = stats["total_allocated"]
    assert folded.get("active_allocated", 0) == resident, where

    blocks = sum(len(segment["blocks"]) for segment in snapshot["segments"])
    tolerance = 0.5 * (blocks + trace["allocs"]) + 1
    expected = m.peak_memory_bytes - m.fragmentation_bytes
    assert abs(resident + trace["peak"] - expected) <= tolerance, \
        f"{where}: the tools' peak {resident + trace['peak']} B, mpsim's {expected} B"

    # one oom event when the allocations cannot fit; none when mpsim says the rank fits (its fragmentation
    # allowance covers what the allocator model leaves free); either between the two
    if expected > m.capacity_bytes:
        assert trace["ooms"] == 1, where
    elif m.fits:
        assert trace["ooms"] == 0, f"{where}: mpsim says it fits, the allocator model runs out"


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda path: path.stem)
def test_torch_memory_tools_read_every_shipped_scenario(path, exact_bytes):
    result, memory = simulated(path)
    for rank in snapshot_ranks(memory):
        check_rank(result, memory, rank)


@pytest.mark.parametrize("name", VARIANTS)
def test_torch_memory_tools_read_split_backward_held_parameters_and_fragmentation(name, exact_bytes):
    path, overrides = VARIANTS[name]
    result, memory = simulated(path, overrides)
    for rank in snapshot_ranks(memory):
        check_rank(result, memory, rank)


def test_an_out_of_memory_rank_records_one_oom_at_the_failing_request():
    result, memory = simulated(*VARIANTS["gpipe out of memory"])
    rank = max(range(len(memory)), key=lambda r: memory[r].peak_memory_bytes)
    assert not memory[rank].fits
    snapshot = memory_snapshot(result, memory, rank)
    events = snapshot["device_traces"][0]
    [oom] = [index for index, event in enumerate(events) if event["action"] == "oom"]
    # replaying the segments up to the oom: it is the first request that a segment past the device would serve
    reserved = sum(segment["total_size"] for segment in snapshot["segments"]) \
        - sum(e["size"] for e in events if e["action"] == "segment_alloc") \
        + sum(e["size"] for e in events if e["action"] == "segment_free")
    for event in events[:oom]:
        reserved += {"segment_alloc": event["size"], "segment_free": -event["size"]}.get(event["action"], 0)
        assert reserved <= memory[rank].capacity_bytes
    assert events[oom]["device_free"] == memory[rank].capacity_bytes - reserved
    assert events[oom + 1]["action"] == "segment_alloc"
    assert reserved + events[oom + 1]["size"] > memory[rank].capacity_bytes


@pytest.mark.parametrize("name", VARIANTS)
def test_the_memory_plot_and_the_report_reach_the_tables_peak(name):
    # both draw a floor plus what the passes allocate and free (memory.memory_timeline); their highest
    # point is the rank's peak in the memory table, gathered parameters coming and going included
    from types import SimpleNamespace

    from mpsim.results.html.payload import _rank_memory
    from mpsim.results.memory_views import GiB, _rank_curve

    result, memory = simulated(*VARIANTS[name])
    for m in memory:
        times, values = _rank_curve(result, m)
        assert times == sorted(times), (name, m.rank)  # a step function forward in time
        assert max(values) * GiB == pytest.approx(m.peak_memory_bytes, rel=1e-12), (name, m.rank)
        drawn = _rank_memory(result, SimpleNamespace(memory=memory), m.rank)
        assert abs(drawn["resident"] + max(drawn["held"]) - m.peak_memory_bytes) <= 2, (name, m.rank)
