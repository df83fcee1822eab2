"""Which device, at which speed, each simulated pipeline rank stands for.

The engine simulates one pipeline rank per TP x CP x DP group (the symmetry collapse,
docs/architecture.md). On a healthy, homogeneous cluster every member of that group is
the same device, so one :class:`~mpsim.cost.actions.CostModel` prices every stage. Two
things break the sameness, and both are resolved here into one :class:`RankDevice` per
pipeline rank:

* **Parts** (``cluster.parts``): ranks fill the parts in order, node by node. A pipeline
  rank's devices must all lie in one part (its group would otherwise run at the pace of
  its slowest member on every collective, which is not a layout anyone runs); the rank
  is priced on that part's system.
* **Faults** (``faults``): a slow GPU or node slows the compute of every pipeline rank
  it holds a device of. Its TP and CP peers wait for it inside every collective, and its
  DP replicas wait for it at the gradient reduction, so the simulated rank, which stands
  for the slowest member of its group, runs at the slowest member's speed. A slow NVLink
  or NIC of a node slows the collectives and pipeline sends of every pipeline rank with
  a device on that node, since a ring or a send runs at its slowest link.

Representing every pipeline rank by its slowest member is exact for the step time when
one replica is degraded (the healthy replicas finish earlier and wait at the reduction,
docs/heterogeneous.md); with faults in several replicas it combines the worst member of
each stage into one pipeline, an upper bound.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from mpsim.errors import InputError
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.specs.system import ScaleOutSpec, SystemSpec


@dataclass(frozen=True)
class RankDevice:
    """The device one pipeline rank runs on: its part, system (links degraded as the faults say) and compute speed."""

    part: int
    system: SystemSpec
    compute_speed: float  # fraction of the device's datasheet compute (and memory) speed


def _pp_rank(layout: Layout, global_rank: int) -> int:
    return (global_rank // layout.stride("pp")) % layout.pp


def _node_pp_ranks(layout: Layout, node: int) -> set[int]:
    """Pipeline ranks with a device on ``node``."""
    per_node = layout.devices_per_node
    return {_pp_rank(layout, rank) for rank in range(node * per_node, min((node + 1) * per_node, layout.devices))}


def part_of_pp_ranks(scenario: Scenario, layout: Layout) -> tuple[int, ...]:
    """The part each pipeline rank lies in (all zeros without ``cluster.parts``).

    Raises InputError naming ``cluster.parts`` when a pipeline rank's devices span two parts.
    """
    parts = scenario.cluster.parts
    if not parts:
        return (0,) * layout.pp
    if scenario.calibration is not None and any(part.system.accelerator != parts[0].system.accelerator for part in parts):
        raise InputError("a calibration profile measures one device; it cannot price parts with different "
                         "accelerators (drop calibration or use one system)", field="calibration")
    starts, offset = [], 0
    for part in parts:
        starts.append(offset)
        offset += part.nodes * part.system.devices_per_node
    stride = layout.stride("pp")
    owner: list[int | None] = [None] * layout.pp
    for block in range(layout.devices // stride):  # runs of ``stride`` ranks share one pipeline rank
        first, last = block * stride, (block + 1) * stride - 1
        part_first, part_last = bisect.bisect_right(starts, first) - 1, bisect.bisect_right(starts, last) - 1
        pp_rank = block % layout.pp
        if part_first != part_last or owner[pp_rank] not in (None, part_first):
            raise InputError(f"pipeline rank {pp_rank} has devices in two parts; each part must hold whole "
                             f"pipeline stages (put pp outermost in parallel.order and give each part a multiple "
                             f"of {layout.devices // layout.pp} devices, one stage's)", field="cluster.parts")
        owner[pp_rank] = part_first
    return tuple(part or 0 for part in owner)


def _degraded(system: SystemSpec, nvlink_speed: float, nic_speed: float) -> SystemSpec:
    """``system`` with its scale-up fabric and NICs at the given fractions of their bandwidth."""
    if nvlink_speed == 1.0 and nic_speed == 1.0:
        return system
    up = system.scale_up.model_copy(update={"bandwidth_per_device": system.scale_up.bandwidth_per_device * nvlink_speed})
    out = system.scale_out.model_copy(update={"nic_bandwidth": system.scale_out.nic_bandwidth * nic_speed})
    return system.model_copy(update={"scale_up": up, "scale_out": out})


def rank_devices(scenario: Scenario, layout: Layout) -> tuple[RankDevice, ...]:
    """One :class:`RankDevice` per pipeline rank: its part's system, degraded by the faults."""
    parts = part_of_pp_ranks(scenario, layout)
    systems = [part.system for part in scenario.cluster.parts] if scenario.cluster.parts else [scenario.cluster.system]
    faults = scenario.faults
    compute = [1.0] * layout.pp
    nvlink = [1.0] * layout.pp
    nic = [1.0] * layout.pp
    for gpu in faults.slow_gpu:
        rank = _pp_rank(layout, gpu.rank)
        compute[rank] = min(compute[rank], gpu.speed)
    for node in faults.slow_node:
        for rank in _node_pp_ranks(layout, node.node):
            compute[rank] = min(compute[rank], node.speed)
    for link in faults.slow_link:
        speeds = nvlink if link.link == "nvlink" else nic
        for rank in _node_pp_ranks(layout, link.node):
            speeds[rank] = min(speeds[rank], link.speed)
    return tuple(RankDevice(parts[r], _degraded(systems[parts[r]], nvlink[r], nic[r]), compute[r])
                 for r in range(layout.pp))


def pair_system(a: RankDevice, b: RankDevice, between_parts: ScaleOutSpec | None) -> SystemSpec:
    """The system a send between two pipeline ranks is priced on: each fabric the slower of the two
    sides', and across parts the network between the parts."""
    if a.system is b.system:
        return a.system
    up = min((a.system.scale_up, b.system.scale_up), key=lambda fabric: fabric.bandwidth_per_device)
    out = min((a.system.scale_out, b.system.scale_out), key=lambda net: net.nic_bandwidth * net.nics_per_node)
    if a.part != b.part and between_parts is not None:
        out = between_parts
    return a.system.model_copy(update={"scale_up": up, "scale_out": out})
