"""A collective seen from every rank: its wait for the last peer taken out.

An NCCL kernel starts when its rank reaches the collective, but no data moves until every
rank of the group has arrived: on one rank the kernel's duration is the wait for the
slowest peer plus the transfer. One rank's trace cannot tell the two apart (the same
message takes 31 us or 295 us depending on who came late). The traces of every rank of a
group can: the transfer of one collective runs from the moment its last rank started it
to the moment each rank's kernel ends.

Finding one collective on each of its ranks:

* who took part: the ranks recent PyTorch records (``Process Group Ranks``); without
  them, only a collective over the whole job (group size = world size) has known ranks,
  and a smaller group's (TP, PP, one of several DP groups) is left as it ran;
* which one it is: the group's name and the collective's sequence number in it
  (``Seq``) where recorded; else the order, since NCCL requires every rank of a
  communicator to issue its collectives in the same order: the ``k``-th collective of a
  given kind and message of those ranks within one ``ProfilerStep`` is the same one on
  each of them.

The traces must be of one job: one world size, each rank at most once (another copy of a
rank makes the job ambiguous, and nothing of it is matched). Sends and receives are left
as they ran: a pipeline's transfer waits for its one peer, which the group's ranks and
sequence numbers do not name.

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

from mpsim.traces.model import Kernel, Trace


@dataclass
class PeerWaits:
    """Transfer times of the collectives found on every rank, and why the others keep their waits."""

    # (index of the trace in the list given, index of the kernel in its trace) -> seconds
    # from the last rank's start to this kernel's end
    transfer_s: dict[tuple[int, int], float] = field(default_factory=dict)
    jobs: int = 0  # jobs (world sizes) the traces were matched within
    # collective kernels still timed as they ran, wait included, by reason
    kept: dict[str, int] = field(default_factory=dict)

    def of(self, trace_index: int) -> dict[int, float]:
        """The transfer times of one trace's collectives, by the kernel's index in that trace."""
        return {kernel: seconds for (which, kernel), seconds in self.transfer_s.items() if which == trace_index}


NO_PEERS = "the traces of the other ranks of its group were not given"
TWICE = "another trace of the same rank was given (which one is this job's?)"
POINT_TO_POINT = "a send or receive: its one peer, not its group, decides its wait"
SUBGROUP = "a group smaller than the job whose ranks the trace does not record"
UNORDERED = "neither a sequence number nor a ProfilerStep and message to order it by"
NOT_EVERYWHERE = "not found on every rank of its group (different steps or collectives recorded)"
CLOCKS = "its ranks' clocks disagree"


def _jobs(traces: list[Trace]) -> tuple[list[dict[int, int]], set[int]]:
    """Per job (one world size), trace index by rank; and the traces of jobs left out because a
    rank was given twice."""
    by_size: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, trace in enumerate(traces):
        if trace.rank is not None and trace.world_size and trace.world_size > 1 and trace.origin_us is not None:
            by_size[trace.world_size][trace.rank].append(index)
    jobs, ambiguous = [], set()
    for _, ranks in sorted(by_size.items()):
        if all(len(found) == 1 for found in ranks.values()):
            jobs.append({rank: found[0] for rank, found in ranks.items()})
        else:
            ambiguous.update(index for found in ranks.values() for index in found)
    return jobs, ambiguous


def _members(kernel: Kernel, world: int) -> tuple[int, ...] | None:
    """The ranks of a collective: as recorded, or the whole job's for a collective over all of it."""
    collective = kernel.collective
    if collective.group_ranks is not None:
        return collective.group_ranks
    if collective.group_size == world:
        return tuple(range(world))
    return None


def _collectives(trace: Trace) -> int:
    return sum(1 for kernel in trace.kernels if kernel.category == "collective")


def peer_waits(traces: list[Trace]) -> PeerWaits:
    """The transfer time of every collective whose ranks' traces all show it (module doc)."""
    result = PeerWaits()
    kept: dict[str, int] = defaultdict(int)
    jobs, ambiguous = _jobs(traces)
    in_jobs = {index for job in jobs for index in job.values()}
    kept[TWICE] = sum(_collectives(traces[index]) for index in ambiguous)
    kept[NO_PEERS] = sum(_collectives(trace) for index, trace in enumerate(traces)
                         if index not in in_jobs and index not in ambiguous)
    for job in jobs:
        world = traces[next(iter(job.values()))].world_size
        origin = min(traces[index].origin_us for index in job.values())
        offset_s = {rank: (traces[index].origin_us - origin) * 1e-6 for rank, index in job.items()}
        # the same collective on each of its ranks: identity -> {rank: kernel index}
        found: dict[tuple, dict[int, int]] = defaultdict(dict)
        for rank, index in job.items():
            seen: dict[tuple, int] = defaultdict(int)
            for position, kernel in enumerate(traces[index].kernels):
                if kernel.category != "collective":
                    continue
                collective = kernel.collective
                if collective is not None and collective.kind == "send-recv":
                    kept[POINT_TO_POINT] += 1
                    continue
                members = _members(kernel, world) if collective is not None else None
                if members is None:
                    kept[SUBGROUP] += 1
                    continue
                if any(member not in job for member in members) or rank not in members:
                    kept[NO_PEERS] += 1
                    continue
                if collective.seq is not None:
                    identity = (members, collective.group_name, collective.seq)
                elif kernel.step is not None and collective.message_bytes:
                    order = (members, kernel.step, collective.kind, collective.message_bytes)
                    identity = order + (seen[order],)
                    seen[order] += 1
                else:
                    kept[UNORDERED] += 1
                    continue
                found[identity][rank] = position
        for identity, positions in found.items():
            members = identity[0]
            if set(positions) != set(members):
                kept[NOT_EVERYWHERE] += len(positions)
                continue
            kernels = {rank: traces[job[rank]].kernels[position] for rank, position in positions.items()}
            last_start = max(k.start_s + offset_s[rank] for rank, k in kernels.items())
            ends = {rank: k.end_s + offset_s[rank] for rank, k in kernels.items()}
            transfers = {rank: end - last_start for rank, end in ends.items()}
            if min(transfers.values()) <= 0 or max(ends.values()) - min(ends.values()) >= min(transfers.values()):
                kept[CLOCKS] += len(positions)
                continue
            for rank, position in positions.items():
                result.transfer_s[(job[rank], position)] = transfers[rank]
    result.jobs = len(jobs)
    result.kept = {reason: count for reason, count in kept.items() if count > 0}
    return result
