"""Collective algorithms on GPU nodes and fat trees, as NCCL runs them.

Each function prices one algorithm for a group of ``n`` ranks on ``k`` nodes with ``g``
ranks per node; :func:`candidates` lists those that apply and the caller takes the
fastest, the way NCCL's tuner picks an algorithm per call from its own cost model.

* **Ring** (Thakur et al. 2005): all-reduce is ``2(n-1)`` steps moving ``2(n-1)/n S``
  bytes per rank; all-gather and reduce-scatter ``n-1`` steps and ``(n-1)/n S``. Across
  nodes NCCL lays its rings out rail by rail: every ring leaves each node once, through a
  different NIC per channel, so a node's ``g`` NICs carry the ring's bytes together and
  its bus bandwidth tops out at the node's NIC bandwidth (8x 400 Gb/s: about 388 GB/s,
  as a 4-node B200 run measures), while its NVLink hops run alongside.
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

Latencies are NCCL's Simple-protocol terms (``src/graph/tuning.cc``): a base per call,
then a per-step latency for each hop inside a node or across nodes.
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
class Estimate:
    """One algorithm's predicted time for a collective."""

    algorithm: str
    time_s: float


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


def ring(kind: str, message_bytes: float, group: GpuGroup) -> float:
    """A flat, rail-aligned ring over the whole group."""
    n, k, g = group.size, group.nodes, group.per_node
    steps, factor = ring_shape(kind, n)
    volume = factor * message_bytes
    # k of the ring's n hops cross a node boundary
    inter_steps = steps * k / n if k > 1 else 0.0
    latency = group.base_latency_s + (steps - inter_steps) * group.intra.step_latency_s
    latency += inter_steps * group.inter.step_latency_s
    loads = []
    if g > 1:
        loads.append((volume, group.intra))
    if k > 1:
        # each node sends the ring's volume once, spread over the NICs of its g ranks
        loads.append((volume / g, group.inter))
    return transfer_s(latency, loads, message_bytes)


def tree_all_reduce(message_bytes: float, group: GpuGroup) -> float:
    """NCCL's double binary tree: a chain in each node, two trees over the nodes."""
    k, g = group.nodes, group.per_node
    latency = 2 * ((g - 1) + math.ceil(math.log2(k))) * TREE_STEP_LATENCY_S
    loads = [(2 * message_bytes / g, group.inter)]
    if g > 1:
        loads.append((2 * message_bytes, group.intra))
    return transfer_s(latency, loads, message_bytes)


def nvls_all_reduce(message_bytes: float, group: GpuGroup) -> float:
    """In-switch all-reduce inside one node."""
    assert group.in_switch is not None
    n = group.size
    return transfer_s(group.in_switch_latency_s, [(message_bytes * (n + 1) / n, group.in_switch)], message_bytes)


def nvls_tree_all_reduce(message_bytes: float, group: GpuGroup) -> float:
    """In-switch reduction inside each node, a tree over the nodes for each rank's shard."""
    assert group.in_switch is not None
    k, g = group.nodes, group.per_node
    latency = group.in_switch_latency_s + 2 * math.ceil(math.log2(k)) * NVLS_TREE_NET_STEP_LATENCY_S
    loads = [(message_bytes * (g + 1) / g, group.in_switch), (2 * message_bytes / g, group.inter)]
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
    found = [Estimate("ring", ring(kind, message_bytes, group))]
    multi_node = group.nodes > 1
    if multi_node and group.per_node > 1:
        found.append(Estimate("hierarchical", hierarchical(kind, message_bytes, group)))
    if multi_node and group.per_node == 1 and kind in ("all-gather", "reduce-scatter"):
        found.append(Estimate("pat", pat(kind, message_bytes, group)))
    if kind == "all-reduce":
        if multi_node:
            found.append(Estimate("tree", tree_all_reduce(message_bytes, group)))
        if group.in_switch is not None:
            if not multi_node and group.size >= group.in_switch_min_ranks:
                found.append(Estimate("nvls", nvls_all_reduce(message_bytes, group)))
            if multi_node and group.per_node >= group.in_switch_min_ranks:
                found.append(Estimate("nvls-tree", nvls_tree_all_reduce(message_bytes, group)))
    return found
