"""Collective algorithms on GPU nodes and fat trees, as NCCL runs them.

Each function prices one algorithm for a group of ``n`` ranks on ``k`` nodes with ``g``
ranks per node; :func:`candidates` lists those that apply and the caller takes the
fastest, the way NCCL's tuner picks an algorithm per call from its own cost model.

* **Ring** (Thakur et al. 2005): all-reduce is ``2(n-1)`` steps moving ``2(n-1)/n S``
  bytes per rank; all-gather and reduce-scatter ``n-1`` steps and ``(n-1)/n S``. Across
  nodes NCCL lays its rings out rail by rail: every ring leaves each node once, through a
  different NIC per channel, so a node's ``g`` NICs carry the ring's bytes together and
  its bus bandwidth tops out at the node's NIC bandwidth (8x 400 Gb/s: about 388 GB/s,
  as a 4-node B200 run measures), while its NVLink hops run alongside, carrying ``(g-1)/g``
  of a rank's bytes (the rank a channel leaves from sends to its NIC instead).
* **Double binary tree** (NCCL 2.4+, all-reduce across nodes): a chain inside each node
  and two binary trees over the nodes; every rank sends and receives ``2S``, but the
  latency grows with ``log2(k)`` instead of ``k``, so it wins for many nodes.
* **Hierarchical**: reduce-scatter inside the node, the collective across nodes on
  ``1/g`` of the data (each rank on its own rail), all-gather inside the node, one
  phase after another.
* **NVLS** (NVLink SHARP, all-reduce in one node): the switch adds the contributions, so
  a rank moves ``S (n+1)/n`` bytes each way instead of ``2 S (n-1)/n``. NCCL uses it from
  5-6 GPUs up. **NVLS-tree** adds a tree across nodes.
* **PAT** (Parallel Aggregated Trees, NCCL 2.23+, all-gather and reduce-scatter with
  one rank per node): the ring's bytes, but a latency that grows with ``log2(k)`` plus a
  small linear part instead of ``k`` full network steps; NCCL's tuner gives it three
  quarters of the ring's bus bandwidth, so it wins on small messages over many nodes (a
  data-parallel group of a TP-8 layout reduce-scattering its buckets over hundreds of
  nodes).
* **Pairwise all-to-all**: ``n-1`` exchanges of ``S/n``; peers in the node over the
  scale-up fabric, the others through the rank's own NIC.

Latencies are NCCL's terms (``src/graph/tuning.cc``): a base per call, then a per-step
latency for each hop inside a node or across nodes. The ring and the tree run in NCCL's
**Simple** protocol (the system file's step latencies) or, where NCCL's model prices it
lower, in **LL** (8-byte stores that carry a flag with each 4 bytes: a fraction of a
microsecond per step at a quarter of the peak bandwidth). Either way the time is never
below the measured curve, which holds what the library reached with the protocols it
chose. LL wins where latency sets the time: a few KB over many nodes (an fp8 amax
reduction takes the tree in LL: 75 us over 64 DGX H100 nodes, where the tree in Simple
takes 728 us), or a small all-reduce in a node (19.8 us for 32 KiB on 8 H200, where
nccl-tests measures 17.9 us). LL runs where the system's library has it
(``scale_up.nccl_link``). NCCL's third protocol, LL128, is left out: it would compete on
medium messages, where NCCL's latency model for it is faster than the nccl-tests points
below 16 MB (``benchmarks/nccl_busbw.py``) and the measured curves price what was reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpsim.cost.links import LinkCost, transfer_s

# NCCL tuning.cc (hardware.md 2.3): the tree's Simple-protocol per-step latency is 28 us
# over NVLink and over the network alike, with no base latency; NVLS-tree charges 14 us
# per network level of its tree.
TREE_STEP_LATENCY_S = 28e-6
NVLS_TREE_NET_STEP_LATENCY_S = 14e-6
# NVLS-tree's network part runs over the node's NVLS heads, one GPU and its NIC per head, each
# carrying its share of the data across nodes; a node has at most this many
# (NCCL_MAX_NVLS_ARITY in src/include/device.h, 32 since NCCL 2.21.5; the NVLS graph search
# caps its channels, which are the heads, at min(32, GPUs of the node): src/graph/search.cc).
# An 8-GPU node has 8 heads; a 72-GPU NVL72 domain 32, so 40 of its 72 NICs carry none of it.
NVLS_MAX_HEADS = 32
# NCCL tuning.cc, PAT (Simple protocol, the only one it runs): base latency 8 us; latency
# log2(nodes) * interLat / 3.5 + nRanks * 2.8 us, interLat being the network's per-step
# latency (14 us, the ring's); bus bandwidth 0.75 of the channels'. Enabled by default
# (NCCL_PAT_ENABLE=2) only with one GPU per node (ncclPatEnable).
PAT_BASE_LATENCY_S = 8e-6
PAT_LOG_STEP_DIVISOR = 3.5
PAT_PER_RANK_LATENCY_S = 2.8e-6
PAT_BANDWIDTH_FACTOR = 0.75

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")


@dataclass(frozen=True)
class Protocol:
    """NCCL's latency terms of one protocol (tuning.cc, NCCL-TUNE at b6475625; hardware.md
    2.3). Step latencies by NCCL's hardware class: ``nvlink`` and ``pci`` inside a node,
    ``net`` across nodes."""

    name: str
    ring_base_s: float
    tree_base_s: float
    ring_step_s: dict[str, float]
    tree_step_s: dict[str, float]


LL = Protocol("LL", 6.6e-6, 6.8e-6, {"nvlink": 0.6e-6, "pci": 1.0e-6, "net": 2.7e-6},
              {"nvlink": 0.6e-6, "pci": 1.0e-6, "net": 5.0e-6})
# Inter-node rings pay at least the network's post overhead per step (getNetOverhead: 1 us on
# Intel and non-x86 hosts, 2 us on AMD x86 hosts, which the system files do not tell apart)
NET_OVERHEAD_S = 1e-6


def ring_bandwidth_factor(kind: str, group: GpuGroup) -> float:
    """A ring's share of Simple's bus bandwidth in LL (tuning.cc): a quarter, a third in one
    node outside reductions (and never above NCCL's cap, ``ll_floor_s``)."""
    return 0.25 if group.nodes > 1 or kind == "all-reduce" else 1 / 3


# the tree's share of its Simple bus bandwidth in LL (tuning.cc)
TREE_LL_BANDWIDTH_FACTOR = 1 / 3.8
# NCCL's cap on LL's bus bandwidth (tuning.cc llMaxBws), by nodes (1, 2, 3 and more): in one
# node Ampere's and Hopper's 87.7 GB/s (Volta's is 39, Blackwell's 282 in later releases);
# across nodes the lower of its two host rows (Intel and other hosts 39.0 / 20.4, AMD hosts
# 22.5 / 19.0), as the system files do not name the host CPU. A lower cap only makes LL lose
# sooner to Simple.
LL_MAX_BUS_BANDWIDTH = {1: 87.7e9, 2: 22.5e9, 3: 19.0e9}


def ll_floor_s(message_bytes: float, algorithm_ratio: float, group: GpuGroup) -> float:
    """The least time LL's capped bus bandwidth allows; ``algorithm_ratio`` turns NCCL's bus
    bandwidth into the algorithm's (a ring ``n / steps``, the tree 0.5)."""
    return message_bytes / (LL_MAX_BUS_BANDWIDTH[min(group.nodes, 3)] * algorithm_ratio)


@dataclass(frozen=True)
class Estimate:
    """One algorithm's predicted time for a collective."""

    algorithm: str
    time_s: float
    protocol: str = "Simple"  # NCCL's protocol: Simple or LL ("" for a library that is not NCCL: a TPU's)


@dataclass(frozen=True)
class GpuGroup:
    """A process group as NCCL's algorithms see it."""

    size: int  # n ranks
    nodes: int  # k nodes
    per_node: int  # g ranks on a node
    intra: LinkCost  # per rank inside a node, for a group of g there
    inter: LinkCost  # per rank across nodes: its share of the NICs after the fat tree's taper
    base_latency_s: float
    in_switch: LinkCost | None = None  # NVLS per rank, where the switch can reduce
    in_switch_latency_s: float = 0.0
    in_switch_min_ranks: int = 0
    # NCCL's hardware class of the links inside a node ("nvlink", "pci"): LL runs besides
    # Simple; None: Simple only
    nccl_link: str | None = None

    def protocols(self) -> tuple[Protocol, ...]:
        """The protocols NCCL may take here besides Simple."""
        return () if self.nccl_link is None else (LL,)


def ring_shape(kind: str, n: int) -> tuple[int, float]:
    """(steps, bytes each rank sends per byte of the nccl-tests size) of a ring collective."""
    if kind == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if kind in ("all-gather", "reduce-scatter"):
        return n - 1, (n - 1) / n
    raise ValueError(f"unknown collective {kind!r}")


def ring_on_link(kind: str, message_bytes: float, n: int, link: LinkCost, base_latency_s: float) -> float:
    """A ring over ``n`` ranks that all sit on one kind of link."""
    if n <= 1 or message_bytes <= 0:
        return 0.0
    steps, factor = ring_shape(kind, n)
    return transfer_s(base_latency_s + steps * link.step_latency_s, [(factor * message_bytes, link)], message_bytes)


def ring(kind: str, message_bytes: float, group: GpuGroup, protocol: Protocol | None = None) -> float:
    """A flat, rail-aligned ring over the whole group, in ``protocol`` (None: Simple)."""
    n, k, g = group.size, group.nodes, group.per_node
    steps, factor = ring_shape(kind, n)
    volume = factor * message_bytes
    # k of the ring's n hops cross a node boundary
    inter_steps = steps * k / n if k > 1 else 0.0
    share, floor_s = 1.0, 0.0
    if protocol is None:
        base, intra_step, inter_step = group.base_latency_s, group.intra.step_latency_s, group.inter.step_latency_s
    else:
        assert group.nccl_link is not None
        base, intra_step, inter_step = (protocol.ring_base_s, protocol.ring_step_s[group.nccl_link],
                                        protocol.ring_step_s["net"])
        if k > 1:
            intra_step = max(intra_step, NET_OVERHEAD_S)
        share = ring_bandwidth_factor(kind, group)
        floor_s = ll_floor_s(message_bytes, n / steps, group)
    latency = base + (steps - inter_steps) * intra_step + inter_steps * inter_step
    loads = []
    if g > 1:
        # across nodes each channel's ring leaves a node from one of its g ranks, a different
        # one per channel: that rank sends its share to its NIC, not over the node's links, so
        # a rank's scale-up links carry (g-1)/g of the ring's bytes (all of them in one node)
        loads.append((volume * (g - 1) / g if k > 1 else volume, group.intra))
    if k > 1:
        # each node sends the ring's volume once, spread over the NICs of its g ranks
        loads.append((volume / g, group.inter))
    return transfer_s(latency, loads, message_bytes, share, floor_s)


def tree_all_reduce(message_bytes: float, group: GpuGroup, protocol: Protocol | None = None) -> float:
    """NCCL's double binary tree: a chain in each node, two trees over the nodes, in
    ``protocol`` (None: Simple)."""
    k, g = group.nodes, group.per_node
    share, floor_s = 1.0, 0.0
    if protocol is None:
        latency = 2 * ((g - 1) + math.ceil(math.log2(k))) * TREE_STEP_LATENCY_S
    else:
        assert group.nccl_link is not None
        latency = protocol.tree_base_s + 2 * ((g - 1) * protocol.tree_step_s[group.nccl_link]
                                              + math.ceil(math.log2(k)) * protocol.tree_step_s["net"])
        share, floor_s = TREE_LL_BANDWIDTH_FACTOR, ll_floor_s(message_bytes, 0.5, group)
    loads = [(2 * message_bytes / g, group.inter)]
    if g > 1:
        loads.append((2 * message_bytes, group.intra))
    return transfer_s(latency, loads, message_bytes, share, floor_s)


def nvls_all_reduce(message_bytes: float, group: GpuGroup) -> float:
    """In-switch all-reduce inside one node."""
    assert group.in_switch is not None
    n = group.size
    return transfer_s(group.in_switch_latency_s, [(message_bytes * (n + 1) / n, group.in_switch)], message_bytes)


def nvls_tree_all_reduce(message_bytes: float, group: GpuGroup) -> float:
    """In-switch reduction inside each node, a tree over the nodes for each NVLS head's shard
    (``NVLS_MAX_HEADS``: a head's NIC carries ``2 S / heads``, the double binary tree's bytes)."""
    assert group.in_switch is not None
    k, g = group.nodes, group.per_node
    heads = min(g, NVLS_MAX_HEADS)
    latency = group.in_switch_latency_s + 2 * math.ceil(math.log2(k)) * NVLS_TREE_NET_STEP_LATENCY_S
    loads = [(message_bytes * (g + 1) / g, group.in_switch), (2 * message_bytes / heads, group.inter)]
    return transfer_s(latency, loads, message_bytes)


def hierarchical(kind: str, message_bytes: float, group: GpuGroup) -> float:
    """Phases: inside the node, across nodes on 1/g of the data, inside the node again."""
    k, g, base = group.nodes, group.per_node, group.base_latency_s
    inside = lambda phase, size: ring_on_link(phase, size, g, group.intra, base)  # noqa: E731
    across = lambda phase, size: ring_on_link(phase, size, k, group.inter, base)  # noqa: E731
    if kind == "all-reduce":
        return inside("reduce-scatter", message_bytes) + across("all-reduce", message_bytes / g) + inside(
            "all-gather", message_bytes)
    if kind == "all-gather":
        return across("all-gather", message_bytes / g) + inside("all-gather", message_bytes)
    if kind == "reduce-scatter":
        return inside("reduce-scatter", message_bytes) + across("reduce-scatter", message_bytes / g)
    raise ValueError(f"unknown collective {kind!r}")


def pat(kind: str, message_bytes: float, group: GpuGroup) -> float:
    """NCCL's PAT all-gather or reduce-scatter over one rank per node."""
    if kind not in ("all-gather", "reduce-scatter"):
        raise ValueError(f"PAT runs all-gather and reduce-scatter, not {kind}")
    n, k = group.size, group.nodes
    latency = (PAT_BASE_LATENCY_S + math.floor(math.log2(k)) * group.inter.step_latency_s / PAT_LOG_STEP_DIVISOR
               + n * PAT_PER_RANK_LATENCY_S)
    inter = LinkCost(group.inter.bandwidth * PAT_BANDWIDTH_FACTOR, group.inter.step_latency_s,
                     group.inter.half_bandwidth_bytes, group.inter.curve_exponent)
    return transfer_s(latency, [((n - 1) / n * message_bytes, inter)], message_bytes)


def pairwise_all_to_all(message_bytes: float, group: GpuGroup) -> float:
    """Every rank sends ``S/n`` to each peer: node peers over the fabric, others through its NIC."""
    n, g = group.size, group.per_node
    latency = group.base_latency_s + (g - 1) * group.intra.step_latency_s + (n - g) * group.inter.step_latency_s
    loads = [((g - 1) / n * message_bytes, group.intra), ((n - g) / n * message_bytes, group.inter)]
    return transfer_s(latency, loads, message_bytes)


def candidates(kind: str, message_bytes: float, group: GpuGroup) -> list[Estimate]:
    """Every algorithm that applies to this group and collective, with its time."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    if kind == "all-to-all":
        return [Estimate("pairwise", pairwise_all_to_all(message_bytes, group))]
    found = [_fastest_protocol("ring", lambda protocol: ring(kind, message_bytes, group, protocol), group)]
    multi_node = group.nodes > 1
    if multi_node and group.per_node > 1:
        found.append(Estimate("hierarchical", hierarchical(kind, message_bytes, group)))
    if multi_node and group.per_node == 1 and kind in ("all-gather", "reduce-scatter"):
        found.append(Estimate("pat", pat(kind, message_bytes, group)))
    if kind == "all-reduce":
        if multi_node:
            found.append(_fastest_protocol("tree", lambda protocol: tree_all_reduce(message_bytes, group, protocol),
                                           group))
        if group.in_switch is not None:
            if not multi_node and group.size >= group.in_switch_min_ranks:
                found.append(Estimate("nvls", nvls_all_reduce(message_bytes, group)))
            if multi_node and group.per_node >= group.in_switch_min_ranks:
                found.append(Estimate("nvls-tree", nvls_tree_all_reduce(message_bytes, group)))
    return found


def _fastest_protocol(algorithm: str, seconds, group: GpuGroup) -> Estimate:
    """``algorithm`` in the protocol NCCL's tuner would take for it: the fastest of Simple and
    the group's low-latency protocols (``seconds(protocol)``; None is Simple)."""
    best = Estimate(algorithm, seconds(None))
    for protocol in group.protocols():
        time_s = seconds(protocol)
        if time_s < best.time_s:
            best = Estimate(algorithm, time_s, protocol.name)
    return best
