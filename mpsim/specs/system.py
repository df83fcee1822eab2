"""A system: nodes of accelerators, a scale-up fabric inside a node, a network between.

The scale-up fabric joins the devices of one node (or of one NVLink domain / TPU slice);
the scale-out network joins such nodes. Three scale-up shapes exist in real machines:

* ``switch``: every device reaches every other at its full link rate through switches
  (NVLink + NVSwitch; a GB200 NVL72 rack is one 72-device "node" of this kind). Some
  switches can add up the data passing through them (NVLink SHARP, NCCL's NVLS).
* ``full-mesh``: a direct link between every pair and no switch (AMD Infinity Fabric on
  an 8x MI300X board): a group of ``m`` devices can use only ``m - 1`` of each device's
  links, so small groups see a fraction of the node's bandwidth.
* ``torus``: each chip links to its neighbours along each axis of a 2D or 3D grid, with
  optional wraparound links closing each axis into a ring (TPU ICI). The "node" is the
  whole slice.

Link bandwidths are per device and per direction, as NVIDIA's datasheets give NVLink
("450 GB/s" per direction for H100 SXM). ``efficiency`` is the fraction of that a
collective library reaches on large messages (nccl-tests measurements, or NCCL's own
per-link constants), and the latencies are the per-step terms of NCCL's model. The shape
of the measured bandwidth-versus-size curve is given by its half-bandwidth size and an
exponent (see ``mpsim/cost/links.py``).

The network is a fat tree of switch levels (leaf, spine, core). A collective whose nodes
all hang below one switch group of a level never climbs above it; one that spans several
groups crosses that level's uplinks and feels their oversubscription.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from mpsim.specs.accelerator import AcceleratorSpec
from mpsim.specs.base import Spec
from mpsim.units import Bandwidth, Bytes, Seconds

CURVE_EXPONENT_DESCRIPTION = (
    "how quickly the measured bus bandwidth approaches its peak with message size: "
    "busbw(S) = peak / (1 + (half_bandwidth_bytes / S) ** exponent); 1 is Hockney's curve")


class InSwitchReductionSpec(Spec):
    """Reduction inside the switches (NVLink SHARP, used by NCCL's NVLS all-reduce).

    Each device sends its whole buffer into the switch once, the switch adds the
    contributions, and multicasts each reduced shard back: a device moves about
    ``S (n + 1) / n`` bytes each way instead of a ring's ``2 S (n - 1) / n``.
    """

    efficiency: float = Field(
        gt=0, le=1, description="fraction of the link rate the in-switch traffic reaches on large messages")
    min_devices: int = Field(
        5, ge=2, description="smallest group for which the collective library uses in-switch reduction")
    latency: Seconds = Field(ge=0, description="fixed latency of one in-switch all-reduce")
    half_bandwidth_bytes: Bytes = Field(
        0.0, ge=0, description="message size at which the in-switch all-reduce reaches half its peak bus bandwidth")
    curve_exponent: float = Field(1.0, gt=0, le=1, description=CURVE_EXPONENT_DESCRIPTION)


class TorusSpec(Spec):
    """A 2D or 3D torus of chips (TPU ICI): the slice shape and which axes wrap around."""

    dims: list[int] = Field(min_length=1, max_length=3, description="chips along each axis, e.g. [4, 4, 8]")
    wraparound: list[bool] | bool = Field(
        True, description="whether each axis is closed into a ring (one flag for all axes, or one per axis)")

    @model_validator(mode="after")
    def _check(self) -> "TorusSpec":
        if any(d < 1 for d in self.dims):
            raise ValueError(f"dims must be positive, got {self.dims}")
        if isinstance(self.wraparound, list) and len(self.wraparound) != len(self.dims):
            raise ValueError(f"wraparound has {len(self.wraparound)} flags for {len(self.dims)} axes; "
                             f"give one flag per axis or a single true/false")
        return self

    @property
    def chips(self) -> int:
        """Chips in the slice."""
        return math.prod(self.dims)

    def wraps(self, axis: int) -> bool:
        """Whether ``axis`` has wraparound links."""
        return self.wraparound[axis] if isinstance(self.wraparound, list) else self.wraparound


class ScaleUpSpec(Spec):
    """The fabric inside one node (or NVLink domain, or TPU slice)."""

    name: str = ""
    topology: Literal["switch", "full-mesh", "torus"] = "switch"
    bandwidth_per_device: Bandwidth = Field(gt=0, description="per device, one direction, all its links together")
    efficiency: float = Field(gt=0, le=1)
    step_latency: Seconds = Field(ge=0, description="latency per ring step (or per torus hop) inside a node")
    half_bandwidth_bytes: Bytes = Field(
        0.0, ge=0, description="message size at which a collective reaches half its peak bus bandwidth (Hockney's n_1/2)")
    curve_exponent: float = Field(1.0, gt=0, le=1, description=CURVE_EXPONENT_DESCRIPTION)
    links_per_device: int | None = Field(
        None, gt=0, description="links of one device; on a full mesh, one to each peer")
    in_switch_reduction: InSwitchReductionSpec | None = Field(
        None, description="NVLink SHARP (NVLS) or similar; absent where the switches cannot reduce")
    torus: TorusSpec | None = Field(None, description="slice shape, for topology: torus")
    # NCCL's tuner prices a path by its hardware class (tuning.cc hwLat: NVLINK, PCI, NET);
    # the class of the links inside a node picks the LL protocol's step latencies (cost/nccl.py)
    nccl_link: Literal["nvlink", "pci"] | None = Field(
        None, description="the class NCCL prices this fabric as (nvlink or pci): the collective library runs "
                          "NCCL's LL protocol besides Simple; unset: Simple only")

    @model_validator(mode="after")
    def _shape(self) -> "ScaleUpSpec":
        if self.topology == "torus" and self.torus is None:
            raise ValueError("topology: torus needs a 'torus' block with the slice dims, e.g. torus: {dims: [4, 4, 8]}")
        if self.topology != "torus" and self.torus is not None:
            raise ValueError(f"a 'torus' block is given but topology is {self.topology!r}; set topology: torus")
        if self.topology == "full-mesh" and self.links_per_device is None:
            raise ValueError("topology: full-mesh needs links_per_device (one link to each peer)")
        if self.in_switch_reduction is not None and self.topology != "switch":
            raise ValueError(f"in_switch_reduction needs switches, but topology is {self.topology!r}")
        return self

    @property
    def link_bandwidth(self) -> float:
        """Bytes/s of one link in one direction (the device's bandwidth over its links)."""
        if self.topology == "torus":
            assert self.torus is not None
            return self.bandwidth_per_device / (2 * len(self.torus.dims))
        return self.bandwidth_per_device / (self.links_per_device or 1)


class NetworkLevelSpec(Spec):
    """One level of switches of a fat tree (leaf, spine, core)."""

    name: str
    nodes: int | None = Field(
        None, gt=0, description="nodes one switch group of this level joins (a scalable unit for the leaf); "
                                "omit for the top level, which joins everything")
    oversubscription: float | None = Field(
        None, ge=1.0, description="downlink / uplink capacity of this level's switches: traffic that has to leave "
                                  "one of its groups shares the uplinks; default: scale_out.oversubscription")


class ScaleOutSpec(Spec):
    """The network between nodes."""

    name: str = ""
    topology: Literal["fat-tree", "rail-optimized-fat-tree", "datacenter-network"] = "rail-optimized-fat-tree"
    nics_per_node: int = Field(gt=0)
    nic_bandwidth: Bandwidth = Field(gt=0, description="per NIC, one direction")
    efficiency: float = Field(gt=0, le=1)
    step_latency: Seconds = Field(ge=0, description="latency per ring step across nodes")
    oversubscription: float = Field(
        1.0, ge=1.0, description="fat-tree taper, 2.0 means 2:1; applies at every level that does not set its own "
                                 "(without levels: to all traffic between nodes)")
    half_bandwidth_bytes: Bytes = Field(
        0.0, ge=0, description="message size at which a collective reaches half its peak bus bandwidth (Hockney's n_1/2)")
    curve_exponent: float = Field(1.0, gt=0, le=1, description=CURVE_EXPONENT_DESCRIPTION)
    levels: list[NetworkLevelSpec] = Field(
        default_factory=list, description="switch levels from the leaf up; empty: one switch level joins all nodes")

    @model_validator(mode="after")
    def _levels(self) -> "ScaleOutSpec":
        sizes = [level.nodes for level in self.levels]
        if any(size is None for size in sizes[:-1]):
            raise ValueError("only the top level may omit 'nodes'")
        known = [size for size in sizes if size is not None]
        if any(later <= earlier for earlier, later in zip(known, known[1:])):
            raise ValueError(f"levels must join more nodes as they go up, got nodes {known}")
        return self

    def level_oversubscription(self, index: int) -> float:
        """Taper of level ``index``'s uplinks."""
        own = self.levels[index].oversubscription if self.levels else None
        return self.oversubscription if own is None else own


class SystemSpec(Spec):
    """A node design and the network that joins such nodes."""

    name: str
    description: str = ""
    accelerator: AcceleratorSpec
    devices_per_node: int = Field(gt=0)
    scale_up: ScaleUpSpec
    scale_out: ScaleOutSpec
    collective_base_latency: Seconds = Field(ge=0, description="fixed cost of one collective call")
    collective_channels: int = Field(
        0, ge=0, description="SMs a running collective occupies (NCCL channels); compute overlapped with it slows down")

    def collective_sm_share(self, compute_units: int | None = None) -> float:
        """Share of the device's SMs a running collective holds (``collective_channels`` of
        ``compute_units``, the accelerator's own count unless given): compute beside it runs
        at the rest."""
        units = compute_units or self.accelerator.compute_units
        return min(1.0, self.collective_channels / units) if units else 0.0

    @model_validator(mode="after")
    def _fabric_fits_node(self) -> "SystemSpec":
        if self.collective_channels > self.accelerator.compute_units:
            raise ValueError(f"collective_channels={self.collective_channels} is more than the accelerator's "
                             f"{self.accelerator.compute_units} SMs (compute_units); NCCL runs 1-32 channels, "
                             f"one SM each")
        up = self.scale_up
        if up.torus is not None and up.torus.chips != self.devices_per_node:
            raise ValueError(f"scale_up.torus.dims {up.torus.dims} hold {up.torus.chips} chips, but devices_per_node is "
                             f"{self.devices_per_node}; make them agree (a node is one slice)")
        if up.topology == "full-mesh" and (up.links_per_device or 0) < self.devices_per_node - 1:
            raise ValueError(f"a full mesh of {self.devices_per_node} devices needs at least "
                             f"{self.devices_per_node - 1} links per device, got links_per_device={up.links_per_device}")
        return self


# The largest cluster a scenario may describe: 2^20 accelerators, about five times the
# largest training clusters reported (100,000-200,000 GPUs); past it ranks, links and
# layouts stop fitting in memory and time, and nothing real is that large.
MAX_DEVICES = 1 << 20


def _restates_parts(data: dict, parts: object) -> bool:
    """Whether ``system`` and ``nodes`` beside ``parts`` are what the parts make them (a dumped cluster read back)."""
    if not isinstance(parts, list) or not parts or not all(isinstance(p, (dict, ClusterPart)) for p in parts):
        return False
    items = [p.model_dump() if isinstance(p, ClusterPart) else p for p in parts]
    system = data.get("system")
    system = system.model_dump() if isinstance(system, SystemSpec) else system
    first = items[0].get("system")
    first = first.model_dump() if isinstance(first, SystemSpec) else first
    nodes = [item.get("nodes") for item in items]
    return (data.get("num_devices") is None and isinstance(first, dict) and system == first
            and all(isinstance(n, int) for n in nodes) and data.get("nodes") == sum(nodes))


class ClusterPart(Spec):
    """One part of a heterogeneous cluster: ``nodes`` nodes of one system (docs/heterogeneous.md)."""

    system: SystemSpec
    nodes: int = Field(gt=0)


class ClusterSpec(Spec):
    """How many of a system's nodes the job gets, or several parts each of its own system.

    With ``parts`` the cluster is the parts in order (ranks fill the first part's nodes
    first); ``system`` and ``nodes`` are then the first part's system and the total, filled
    in here, and ``between_parts`` is the network that joins nodes of different parts.
    """

    system: SystemSpec
    nodes: int | None = Field(None, gt=0)
    num_devices: int | None = Field(None, gt=0)
    parts: list[ClusterPart] | None = Field(
        None, min_length=1, description="a heterogeneous cluster: systems and node counts, in rank order "
                                        "(give parts instead of system and nodes)")
    between_parts: ScaleOutSpec | None = Field(
        None, description="the network between nodes of different parts; required when the parts' systems differ")

    @model_validator(mode="before")
    @classmethod
    def _from_parts(cls, data: object) -> object:
        """With ``parts``: the first part's system and the total node count stand for the cluster."""
        if not isinstance(data, dict) or data.get("parts") is None:
            return data
        parts = data["parts"]
        given = [key for key in ("system", "nodes", "num_devices") if data.get(key) is not None]
        if given and not _restates_parts(data, parts):
            raise ValueError(f"give either parts or {'/'.join(given)}, not both (parts sets the system and size; "
                             f"on the command line: {' '.join(f'--set cluster.{key}=null' for key in given)})")
        if not isinstance(parts, list) or not parts:
            raise ValueError("parts must be a non-empty list of parts, each {system: NAME, nodes: N}")
        for index, part in enumerate(parts):
            if not isinstance(part, dict) or "system" not in part:
                raise ValueError(f"parts.{index}: a part is a mapping with a system and nodes, "
                                 f"e.g. {{system: dgx-h100, nodes: 4}}")
        nodes = [p.get("nodes") for p in parts]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in nodes):
            nodes = [1]  # a part's own error is reported; the total is never used
        return {**data, "system": parts[0]["system"], "nodes": sum(nodes)}

    @model_validator(mode="after")
    def _parts_agree(self) -> "ClusterSpec":
        if self.parts is None:
            if self.between_parts is not None:
                raise ValueError("between_parts is given without parts")
            return self
        per_node = {part.system.devices_per_node for part in self.parts}
        if len(per_node) > 1:
            raise ValueError(f"parts have {sorted(per_node)} devices per node; every part needs the same "
                             f"devices_per_node (ranks are placed node by node)")
        if self.between_parts is None and any(part.system != self.parts[0].system for part in self.parts):
            raise ValueError("parts of different systems need between_parts: the network between their nodes "
                             "(nics_per_node, nic_bandwidth, efficiency, step_latency)")
        return self

    @model_validator(mode="after")
    def _size(self) -> "ClusterSpec":
        per_node = self.system.devices_per_node
        if self.nodes is None and self.num_devices is None:
            raise ValueError("give the cluster size: 'nodes' or 'num_devices'")
        if self.nodes is not None and self.num_devices is not None and self.nodes * per_node != self.num_devices:
            raise ValueError(
                f"nodes={self.nodes} x {per_node} devices per node is {self.nodes * per_node}, "
                f"not num_devices={self.num_devices}; give one of the two"
            )
        devices = self.num_devices if self.num_devices is not None else (self.nodes or 0) * per_node
        if devices > MAX_DEVICES:
            raise ValueError(f"{devices:,} devices is beyond what mpsim simulates (at most {MAX_DEVICES:,}, five "
                             f"times the largest clusters built); give fewer nodes")
        return self

    @property
    def devices(self) -> int:
        """Number of accelerators in the job."""
        if self.num_devices is not None:
            return self.num_devices
        assert self.nodes is not None
        return self.nodes * self.system.devices_per_node
