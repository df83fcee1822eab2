"""A collective seen from every rank (mpsim/traces/peers.py): the wait for the last peer taken out.

The traces here are made by the tests: each rank reaches every all-reduce at its own time,
and the transfer (a known alpha-beta line) starts when the last one arrives, so a rank's
kernel runs for its wait plus the transfer. Given every rank's trace, the transfer must
come back exactly; given fewer, or clocks that disagree, the kernels stay as they ran.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mpsim.calibrate.trace_fit.comms import fit_collectives
from mpsim.calibrate.trace_fit.samples import trace_samples
from mpsim.traces.model import Collective, CpuOp, Kernel, Trace
from mpsim.traces.peers import CLOCKS, NO_PEERS, POINT_TO_POINT, SUBGROUP, TWICE, peer_waits
from mpsim.traces.read import load_trace

LATENCY_S, BANDWIDTH = 20e-6, 50e9
SIZES = [2.0 ** p for p in range(14, 28, 2)]


def transfer_s(size: float) -> float:
    return LATENCY_S + size / BANDWIDTH


def job(world: int = 2, group: int | None = None, origins_us: tuple[float, ...] | None = None,
        skew_s: float = 0.0, record_ranks: bool = False, record_seq: bool = False,
        steps: bool = True) -> list[Trace]:
    """Every rank's trace of one job: per step, an all-reduce of each size in every group of
    ``group`` consecutive ranks (default: one group of all). Rank ``r`` arrives
    ``r * 7 + (size index % 3) * 40`` us into each collective's window, in reverse order every
    other collective, so the last to arrive changes; a group's transfer starts at its last
    arrival. ``origins_us`` puts each trace's zero on the host clock; ``skew_s`` adds to rank
    1's clock; ``record_ranks`` / ``record_seq`` write the group's ranks / the sequence number
    as recent PyTorch does; without ``steps`` no kernel falls in a ProfilerStep."""
    group = group or world
    origins_us = origins_us or tuple(1e9 + 1000.0 * rank for rank in range(world))
    kernels: list[list[Kernel]] = [[] for _ in range(world)]
    window, seq = 0.0, 0  # host-clock seconds since 1e9 us; the groups' sequence number
    for step in (1, 2):
        for number, size in enumerate(SIZES):
            arrivals = [(rank * 7 + (number % 3) * 40) * 1e-6 for rank in range(world)]
            if number % 2:
                arrivals.reverse()
            ends = []
            for rank in range(world):
                members = tuple(range(rank - rank % group, rank - rank % group + group))
                end = window + max(arrivals[m] for m in members) + transfer_s(size)
                ends.append(end)
                start_on_clock = window + arrivals[rank]
                shift = (origins_us[rank] - 1e9) * 1e-6 - (skew_s if rank == 1 else 0.0)
                start = start_on_clock - shift
                op = CpuOp("c10d::allreduce_", start - 5e-6, 3e-6, 1)
                collective = Collective("all-reduce", size, group, "RING", "LL", "fp32",
                                        group_ranks=members if record_ranks else None,
                                        group_name=str(members[0] // group) if record_seq else None,
                                        seq=seq if record_seq else None)
                kernels[rank].append(Kernel("ncclKernel_AllReduce_RING_LL_Sum_float", "collective", start,
                                            end - start_on_clock, 9, len(kernels[rank]), op=op,
                                            step=step if steps else None, collective=collective))
            window = max(ends) + 100e-6
            seq += 1
    return [Trace(source=f"rank{rank}", device_name="NVIDIA A100-SXM4-80GB", device_sms=108,
                  device_memory_bytes=80 * 2 ** 30, compute_capability=(8, 0), rank=rank, world_size=world,
                  kernels=tuple(kernels[rank]), origin_us=origins_us[rank]) for rank in range(world)]


def assert_transfers(traces: list[Trace], found) -> None:
    for (which, index), seconds in found.transfer_s.items():
        kernel = traces[which].kernels[index]
        assert seconds == pytest.approx(transfer_s(kernel.collective.message_bytes), rel=1e-9, abs=1e-12)
        assert seconds <= kernel.duration_s + 1e-12  # the wait only ever came on top


def test_every_rank_gives_the_transfer_back():
    traces = job(world=3)
    found = peer_waits(traces)
    assert found.jobs == 1 and not found.kept
    assert len(found.transfer_s) == 3 * 2 * len(SIZES)
    assert_transfers(traces, found)


@pytest.mark.parametrize("record_seq", [False, True])
def test_recorded_group_ranks_match_the_collectives_of_smaller_groups(record_seq):
    # two 2-rank groups in a 4-rank job, their collectives at the same time and of the same size
    traces = job(world=4, group=2, record_ranks=True, record_seq=record_seq)
    found = peer_waits(traces)
    assert not found.kept and len(found.transfer_s) == 4 * 2 * len(SIZES)
    assert_transfers(traces, found)
    # the ranks of one group suffice for its collectives; the other group's keep their waits
    found = peer_waits(traces[:2])
    assert len(found.transfer_s) == 2 * 2 * len(SIZES) and not found.kept
    found = peer_waits([traces[0], traces[2]])
    assert not found.transfer_s and found.kept == {NO_PEERS: 2 * 2 * len(SIZES)}


def test_a_sequence_number_orders_collectives_outside_profiler_steps():
    assert not peer_waits(job(world=2, record_ranks=True, steps=False)).transfer_s
    traces = job(world=2, record_ranks=True, record_seq=True, steps=False)
    found = peer_waits(traces)
    assert len(found.transfer_s) == 2 * 2 * len(SIZES)
    assert_transfers(traces, found)


def test_the_fit_recovers_the_line_from_the_transfers_and_not_from_one_rank():
    traces = job(world=2)
    both = fit_collectives(trace_samples(traces).collectives)[0]
    assert len(both) == 1
    assert both[0].latency_s == pytest.approx(LATENCY_S, rel=1e-6)
    assert both[0].bandwidth == pytest.approx(BANDWIDTH, rel=1e-6)
    samples = trace_samples(traces)
    assert samples.peer_waits_taken_out == 2 * 2 * len(SIZES) and not samples.peer_waits_kept
    # one rank alone: its kernels hold the waits, and the line it fits is not the transfer's
    alone = trace_samples(traces[:1])
    assert alone.peer_waits_taken_out == 0 and alone.peer_waits_kept == {NO_PEERS: 2 * len(SIZES)}
    fitted = fit_collectives(alone.collectives)[0][0]
    assert fitted.latency_s != pytest.approx(LATENCY_S, rel=0.05)


def test_a_group_smaller_than_the_job_keeps_its_waits():
    # who is in a two-rank group of a four-rank job is not in the traces
    found = peer_waits(job(world=4, group=2))
    assert not found.transfer_s and found.kept == {SUBGROUP: 4 * 2 * len(SIZES)}


def test_a_missing_or_repeated_rank_matches_nothing():
    traces = job(world=3)
    assert peer_waits(traces[:2]).kept == {NO_PEERS: 2 * 2 * len(SIZES)}
    twice = peer_waits([traces[0], traces[1], traces[1]])
    assert not twice.transfer_s and twice.kept == {TWICE: 3 * 2 * len(SIZES)}


def test_sends_and_receives_keep_their_waits():
    # a ring of sends with one sequence number on every rank is not one collective of the group
    traces = [replace(trace, kernels=tuple(replace(k, collective=replace(k.collective, kind="send-recv"))
                                           for k in trace.kernels))
              for trace in job(world=2, record_ranks=True, record_seq=True)]
    found = peer_waits(traces)
    assert not found.transfer_s and found.kept == {POINT_TO_POINT: 2 * 2 * len(SIZES)}


def test_clocks_that_disagree_leave_the_kernels_as_they_ran():
    # rank 1's clock 5 ms ahead of rank 0's (another host): its starts look later than every end
    found = peer_waits(job(world=2, skew_s=5e-3))
    assert not found.transfer_s and found.kept == {CLOCKS: 2 * 2 * len(SIZES)}


def test_the_reader_puts_the_trace_on_the_host_clock(tmp_path):
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0, "tid": 9,
              "ts": 2500.0, "dur": 30.0, "args": {"correlation": 1, "stream": 9, "device": 0}}
    base = {"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "traceEvents": [kernel]}
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(base))
    new.write_text(json.dumps({**base, "baseTimeNanoseconds": 1_700_000_000_000_000_000}))
    assert load_trace(str(old)).origin_us == 2500.0  # older Kineto: ts is the host clock itself
    assert load_trace(str(new)).origin_us == 1_700_000_000_000_000.0 + 2500.0


def kineto_job(tmp_path, traces: list[Trace]) -> list[str]:
    """The traces as Kineto files: each all-reduce launched inside its ProfilerStep, the kernel
    named and sized as recent PyTorch writes it, ``ts`` on the host clock."""
    paths = []
    for trace in traces:
        events, correlation = [], 1
        for number in (1, 2):
            kernels = [k for k in trace.kernels if k.step == number]
            first, last = kernels[0].start_s, kernels[-1].end_s
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1, "tid": 1,
                           "ts": trace.origin_us + (first - 50e-6) * 1e6, "dur": (last - first + 60e-6) * 1e6})
            for kernel in kernels:
                launch_us = trace.origin_us + (kernel.start_s - 10e-6) * 1e6
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                               "ts": launch_us, "dur": 3.0, "args": {"correlation": correlation}})
                events.append({"ph": "X", "cat": "kernel", "name": kernel.name + "(ncclDevComm*)", "pid": 0, "tid": 9,
                               "ts": trace.origin_us + kernel.start_s * 1e6, "dur": kernel.duration_s * 1e6,
                               "args": {"correlation": correlation, "stream": 9, "device": 0,
                                        "Collective name": "allreduce",
                                        "In msg nelems": int(kernel.collective.message_bytes / 4),
                                        "Out msg nelems": int(kernel.collective.message_bytes / 4),
                                        "Group size": kernel.collective.group_size, "dtype": "Float",
                                        **({"Process Group Ranks": str(list(kernel.collective.group_ranks))}
                                           if kernel.collective.group_ranks else {}),
                                        **({"Process Group Name": kernel.collective.group_name,
                                            "Seq": kernel.collective.seq}
                                           if kernel.collective.seq is not None else {})}})
                correlation += 1
        path = tmp_path / f"rank{trace.rank}.json"
        path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": trace.device_name, "numSms": 108}],
                                    "distributedInfo": {"backend": "nccl", "rank": trace.rank,
                                                        "world_size": trace.world_size},
                                    "traceEvents": events}))
        paths.append(str(path))
    return paths


def test_trace_summary_of_every_rank_shows_the_transfer(tmp_path, capsys):
    from mpsim.cli import main

    paths = kineto_job(tmp_path, job(world=2))
    assert main(["trace", "summary", *paths, "--json", "-"]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert len(summaries) == 2
    for summary in summaries:
        rows = {row["message_bytes"]: row for row in summary["collectives"]}
        assert set(rows) == set(SIZES)
        for size, row in rows.items():
            # whole microseconds in the file: the transfer comes back to within one
            assert row["transfer_mean_s"] == pytest.approx(transfer_s(size), abs=1.5e-6)
            assert row["transfer_mean_s"] <= row["mean_s"] + 1e-9
    # one rank's trace alone: no transfer column, the kernels as they ran
    assert main(["trace", "summary", paths[0]]) == 0
    out = capsys.readouterr().out
    assert "transfer" not in out and "busbw" in out
    assert main(["trace", "summary", *paths]) == 0
    out = capsys.readouterr().out
    assert "from the last rank's start" in out and "waiting for the slowest peer" in out


def test_trace_summary_tells_how_long_each_rank_waited_for_its_peers():
    from mpsim.traces.summary import summarize

    traces = job(world=2)
    transfers = peer_waits(traces).transfer_s
    for number, trace in enumerate(traces):
        mine = {kernel: seconds for (which, kernel), seconds in transfers.items() if which == number}
        summary = summarize(trace, None, mine)
        kernels = [k for k in trace.kernels if k.category == "collective"]
        waits = sum(k.duration_s - transfer_s(k.collective.message_bytes) for k in kernels)
        # these traces record no ProfilerStep ranges: the whole trace is the one window
        assert summary.peer_wait_s == pytest.approx(waits, rel=1e-9) and waits > 0
        assert summary.peer_matched_s == pytest.approx(sum(k.duration_s for k in kernels), rel=1e-9)
        assert summarize(trace).peer_wait_s is None


def test_the_reader_takes_the_group_ranks_and_sequence_recent_pytorch_records(tmp_path):
    paths = kineto_job(tmp_path, job(world=4, group=2, record_ranks=True, record_seq=True))
    kernel = load_trace(paths[2]).kernels[0]
    assert kernel.collective.group_ranks == (2, 3) and kernel.collective.group_name == "1"
    assert kernel.collective.seq == 0


@pytest.mark.parametrize("text, ranks", [("[0, 1, 2, 3]", (0, 1, 2, 3)), ([4, 5], (4, 5)), ("[]", None),
                                         ("[0, 1, 2, ..., 63]", None), ("0,1", None), (None, None)])
def test_group_ranks_as_recorded_or_nothing(text, ranks):
    from mpsim.traces.comms import _group_ranks
    assert _group_ranks(text) == ranks
