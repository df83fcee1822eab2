"""A collective seen from every rank: its wait for the last peer taken out.

An NCCL kernel starts when its rank reaches the collective, but no data moves until every
rank of the group has arrived: on one rank the kernel's duration is the wait for the
slowest peer plus the transfer. One rank's trace cannot tell the two apart (the same
message takes 31 us or 295 us depending on who came late). The traces of every rank of a
job can: the transfer of one collective runs from the moment its last rank started it to
the moment each rank's kernel ends.

Finding the same collective on every rank needs no ids. NCCL requires every rank of a
communicator to issue its collectives in the same order, so within one ``ProfilerStep`` the
``k``-th collective of a given kind and message on one rank is the ``k``-th on every
other. This module matches only what it can match without knowing who is in a group:
collectives over the whole job (group size = world size), when the traces of every rank
``0 .. world_size - 1`` of that job are given, each exactly once. A collective of a smaller
group (TP, PP, one DP replica of several) is left as it is: which ranks took part is not
in these traces.

Timestamps are compared on the clock each trace was recorded on: Kineto writes microseconds
of the host's clock, offset by ``baseTimeNanoseconds`` in recent versions
(:attr:`~mpsim.traces.model.Trace.origin_us`). Ranks on different hosts may disagree by
more than a transfer takes; a matched collective is kept only when its ranks' ends lie
closer together than its shortest transfer and every transfer is positive (on one clock
the kernels of one collective end within its last step), so clocks that disagree leave
the durations untouched rather than wrong.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from mpsim.traces.model import Trace


@dataclass
class PeerWaits:
    """Transfer times of the collectives found on every rank, and why the others keep their waits."""

    # (index of the trace in the list given, index of the kernel in its trace) -> seconds
    # from the last rank's start to this kernel's end
    transfer_s: dict[tuple[int, int], float] = field(default_factory=dict)
    jobs: int = 0  # jobs whose every rank's trace was given
    # collective kernels still timed as they ran, wait included, by reason
    kept: dict[str, int] = field(default_factory=dict)


NO_PEERS = "the traces of the other ranks of its job were not given"
SUBGROUP = "a group smaller than the job, or not the same sequence on every rank"
CLOCKS = "its ranks' clocks disagree"


def _jobs(traces: list[Trace]) -> list[list[int]]:
    """Trace indices of each job whose traces cover ranks ``0 .. world_size - 1`` once each, by rank."""
    by_size: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, trace in enumerate(traces):
        if trace.rank is not None and trace.world_size and trace.world_size > 1 and trace.origin_us is not None:
            by_size[trace.world_size][trace.rank].append(index)
    return [[ranks[rank][0] for rank in range(world)] for world, ranks in sorted(by_size.items())
            if sorted(ranks) == list(range(world)) and all(len(found) == 1 for found in ranks.values())]


def _whole_job_collectives(trace: Trace) -> dict[tuple, list[int]]:
    """Kernel indices of the trace's collectives over the whole job, by (step, kind, message), in start order."""
    found: dict[tuple, list[int]] = defaultdict(list)
    for index, kernel in enumerate(trace.kernels):
        collective = kernel.collective
        if (kernel.category == "collective" and collective is not None and kernel.step is not None
                and collective.group_size == trace.world_size and collective.message_bytes):
            found[(kernel.step, collective.kind, collective.message_bytes)].append(index)
    return found


def _collectives(trace: Trace) -> int:
    return sum(1 for kernel in trace.kernels if kernel.category == "collective")


def peer_waits(traces: list[Trace]) -> PeerWaits:
    """The transfer time of every whole-job collective that every rank's trace shows (module doc)."""
    result = PeerWaits()
    kept: dict[str, int] = defaultdict(int)
    jobs = _jobs(traces)
    result.jobs = len(jobs)
    in_jobs = {index for job in jobs for index in job}
    kept[NO_PEERS] = sum(_collectives(trace) for index, trace in enumerate(traces) if index not in in_jobs)
    for job in jobs:
        origin = min(traces[index].origin_us for index in job)
        offset_s = [(traces[index].origin_us - origin) * 1e-6 for index in job]
        by_rank = [_whole_job_collectives(traces[index]) for index in job]
        matched = disagreeing = 0
        for key, first in by_rank[0].items():
            lists = [found.get(key, []) for found in by_rank]
            if any(len(kernels) != len(first) for kernels in lists):
                continue  # not the same sequence on every rank: the steps or the traces differ
            for position in range(len(first)):
                kernels = [traces[index].kernels[lists[rank][position]] for rank, index in enumerate(job)]
                last_start = max(k.start_s + offset_s[rank] for rank, k in enumerate(kernels))
                ends = [k.end_s + offset_s[rank] for rank, k in enumerate(kernels)]
                transfers = [end - last_start for end in ends]
                if min(transfers) <= 0 or max(ends) - min(ends) >= min(transfers):
                    disagreeing += len(job)
                    continue
                for rank, index in enumerate(job):
                    result.transfer_s[(index, lists[rank][position])] = transfers[rank]
                matched += len(job)
        kept[CLOCKS] += disagreeing
        kept[SUBGROUP] += sum(_collectives(traces[index]) for index in job) - matched - disagreeing
    result.kept = {reason: count for reason, count in kept.items() if count > 0}
    return result
