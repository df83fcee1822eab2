"""A system: nodes of accelerators, a scale-up fabric inside a node, a network between.

The scale-up fabric (NVLink + NVSwitch, Infinity Fabric, ...) joins the devices of one
node; the scale-out network (InfiniBand / RoCE NICs in a fat tree) joins nodes. Link
bandwidths are per device and per direction, as NVIDIA's datasheets give NVLink
("450 GB/s" per direction for H100 SXM). ``efficiency`` is the fraction of that a
collective library reaches on large messages (NCCL's own per-link constants, or
nccl-tests measurements), and the latencies are the per-step terms of NCCL's model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mpsim.specs.accelerator import AcceleratorSpec
from mpsim.specs.base import Spec
from mpsim.units import Bandwidth, Bytes, Seconds


class ScaleUpSpec(Spec):
    """The fabric inside one node."""

    name: str = ""
    topology: Literal["switch", "full-mesh"] = "switch"
    bandwidth_per_device: Bandwidth = Field(gt=0, description="per device, one direction")
    efficiency: float = Field(gt=0, le=1)
    step_latency: Seconds = Field(ge=0, description="latency per ring step inside a node")
    half_bandwidth_bytes: Bytes = Field(
        0.0, ge=0, description="message size at which a collective reaches half its peak bus bandwidth (Hockney's n_1/2)")


class ScaleOutSpec(Spec):
    """The network between nodes."""

    name: str = ""
    topology: Literal["fat-tree", "rail-optimized-fat-tree"] = "rail-optimized-fat-tree"
    nics_per_node: int = Field(gt=0)
    nic_bandwidth: Bandwidth = Field(gt=0, description="per NIC, one direction")
    efficiency: float = Field(gt=0, le=1)
    step_latency: Seconds = Field(ge=0, description="latency per ring step across nodes")
    oversubscription: float = Field(1.0, ge=1.0, description="fat-tree taper, 2.0 means 2:1")
    half_bandwidth_bytes: Bytes = Field(
        0.0, ge=0, description="message size at which a collective reaches half its peak bus bandwidth (Hockney's n_1/2)")


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


class ClusterSpec(Spec):
    """How many of a system's nodes the job gets."""

    system: SystemSpec
    nodes: int | None = Field(None, gt=0)
    num_devices: int | None = Field(None, gt=0)

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
        return self

    @property
    def devices(self) -> int:
        """Number of accelerators in the job."""
        if self.num_devices is not None:
            return self.num_devices
        assert self.nodes is not None
        return self.nodes * self.system.devices_per_node
