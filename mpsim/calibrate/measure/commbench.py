"""Point-to-point and collective timings over torch.distributed (gloo on CPU, NCCL on GPU).

* Point-to-point: a ping-pong between ranks 0 and 1 (send, then receive the reply);
  one way is half the round trip. Other ranks wait at the next barrier.
* Collectives: all-reduce, all-gather and reduce-scatter on the first ``n`` ranks for
  each group size ``n`` from 2 to the world size (powers of two and the world size),
  messages sized as nccl-tests sizes them (the all-reduce buffer, the gathered output,
  the reduce-scatter input). A collective's time is the slowest rank's: each rank times
  it and the maximum is taken. Each is called the way a training step calls it: after a
  stretch of compute (``BUSY_MATMULS`` products, the same on every rank, after a
  barrier), not straight after the barrier. On CPU that matters several times over: a
  1 MB gloo all-reduce took 0.6-0.7 ms back to back after a barrier and 2.3-4.4 ms after
  11 ms of matrix products on two ranks of the development machine (the buffers and the
  backend's threads go cold, and the ranks arrive apart), and the tensor-parallel check's
  all-reduces, which follow its GEMMs, are priced from these lines. On a GPU the device
  is synchronised after the products, before the clock starts.

Every size is repeated; the median and spread go into the profile, and
``mpsim/calibrate/fit/fitting.py`` fits ``t = latency + bytes / bandwidth`` through them.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from mpsim.calibrate.measure.timing import summarize

P2P_SIZES = (4 * 2**10, 64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)
COLLECTIVE_SIZES = (64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)
KINDS = ("all-reduce", "all-gather", "reduce-scatter")


def _sync(kind: str) -> None:
    if kind == "cuda":
        torch.cuda.synchronize()


def ping_pong(message_bytes: int, rank: int, device: torch.device, kind: str, repeats: int) -> list[float]:
    """One-way seconds of ``repeats`` ping-pongs between ranks 0 and 1 (empty on other ranks)."""
    buffer = torch.zeros(max(1, message_bytes // 4), dtype=torch.float32, device=device)
    samples = []
    for i in range(repeats + 2):  # two warm-up exchanges
        if rank > 1:
            continue
        _sync(kind)
        begin = time.perf_counter()
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        else:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)
        _sync(kind)
        if i >= 2:
            samples.append((time.perf_counter() - begin) / 2)
    return samples


def _collective(kind: str, buffer: torch.Tensor, out: torch.Tensor, group) -> None:
    if kind == "all-reduce":
        dist.all_reduce(buffer, group=group)
    elif kind == "all-gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, buffer, group=group)
    else:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, buffer, group=group)


# The stretch of compute before each timed collective: products of 512 x 512 fp32 matrices, 1 MiB
# each, so the working set is larger than a core's L2 cache (1 MiB on the development machine's
# EPYC, 256 KiB-2 MiB on current server cores) and the collective meets cold buffers, as it does
# after a layer's GEMMs
BUSY_SIZE = 512
BUSY_MATMULS = 4


def _busy(device: torch.device, dev_kind: str) -> None:
    """A stretch of compute, as a step runs before it reaches a collective."""
    a = torch.ones(BUSY_SIZE, BUSY_SIZE, device=device)
    for _ in range(BUSY_MATMULS):
        a = torch.mm(a, a) * (1.0 / BUSY_SIZE)
    _sync(dev_kind)


def collective_samples(kind: str, message_bytes: int, ranks: int, group, device: torch.device, dev_kind: str,
                       repeats: int) -> list[float]:
    """Seconds of ``repeats`` collectives on this rank, each after a stretch of compute (call on
    members of ``group`` only)."""
    elements = max(ranks, message_bytes // 4 // ranks * ranks)
    if kind == "all-gather":
        buffer = torch.ones(elements // ranks, device=device)
        out = torch.empty(elements, device=device)
    elif kind == "reduce-scatter":
        buffer = torch.ones(elements, device=device)
        out = torch.empty(elements // ranks, device=device)
    else:
        buffer, out = torch.ones(elements, device=device), buffer_placeholder(device)
    samples = []
    for i in range(repeats + 2):
        dist.barrier(group=group)
        _busy(device, dev_kind)
        begin = time.perf_counter()
        _collective(kind, buffer, out, group)
        _sync(dev_kind)
        if i >= 2:
            samples.append(time.perf_counter() - begin)
    return samples


def buffer_placeholder(device: torch.device) -> torch.Tensor:
    return torch.empty(0, device=device)


def group_sizes(world: int) -> list[int]:
    """Group sizes to measure: 2, 4, 8, ... up to the world size, and the world size."""
    sizes, n = [], 2
    while n < world:
        sizes.append(n)
        n *= 2
    if world >= 2:
        sizes.append(world)
    return sizes


def bench_links(rank: int, world: int, device: torch.device, kind: str, repeats: int = 15,
                p2p_sizes=P2P_SIZES, collective_sizes=COLLECTIVE_SIZES) -> dict:
    """Every rank calls this; rank 0's return value holds the measurements (others: partial)."""
    result: dict = {"p2p": [], "collectives": []}
    if world < 2:
        return result
    for size in p2p_sizes:
        samples = ping_pong(size, rank, device, kind, repeats)
        dist.barrier()
        if rank == 0:
            result["p2p"].append({"bytes": float(size), **summarize(samples).as_dict()})
    for ranks in group_sizes(world):
        group = dist.new_group(list(range(ranks))) if ranks < world else None
        for collective in KINDS:
            for size in collective_sizes:
                if rank < ranks:
                    samples = collective_samples(collective, size, ranks, group, device, kind, repeats)
                else:
                    samples = []
                # the slowest member sets the collective's time
                times = torch.tensor(samples or [0.0] * repeats, dtype=torch.float64, device=device)
                dist.all_reduce(times, op=dist.ReduceOp.MAX)
                if rank == 0:
                    result["collectives"].append({"kind": collective, "ranks": ranks, "bytes": float(size),
                                                  **summarize(times.tolist()).as_dict()})
        dist.barrier()
    return result
