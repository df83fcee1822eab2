"""Degraded parts of a cluster: a slow GPU, a slow node, a slow link, each at a fraction of its speed.

Real jobs lose time to stragglers: one GPU throttled by heat or power, one node whose
clocks are capped, one NVLink or NIC that trained down to a lower rate. A ``faults``
block names each such part and the fraction of its datasheet speed it still runs at::

    faults:
      slow_gpu: [{rank: 12, speed: 0.5}]          # or "12@0.5"
      slow_node: [{node: 3, speed: 0.8}]          # or "3@0.8": every GPU of node 3
      slow_link: [{node: 1, link: nic, speed: 0.5}]  # or "1:nic@0.5"; link: nvlink or nic

Ranks are global ranks in the plan's order (``parallel.order``), nodes count from 0 in
rank order; that they exist in the cluster is checked with the layout (``mpsim/resolve.py``). What each fault does to the simulated step is decided on the main path
(``mpsim/cost/devices.py``) and explained in docs/heterogeneous.md. A speed of 1 is a
healthy part: the step is then the same as without the entry.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from mpsim.errors import InputError
from mpsim.specs.base import Spec

SPEED_DESCRIPTION = "fraction of the healthy part's speed, in (0, 1]"


class SlowGpu(Spec):
    """One accelerator whose compute runs at ``speed`` of its datasheet rate."""

    rank: int = Field(ge=0, description="global rank of the GPU, in the plan's rank order")
    speed: float = Field(gt=0, le=1, description=SPEED_DESCRIPTION)


class SlowNode(Spec):
    """Every accelerator of one node at ``speed`` of its rate (capped clocks, a hot rack)."""

    node: int = Field(ge=0, description="node index, counting from 0 in rank order")
    speed: float = Field(gt=0, le=1, description=SPEED_DESCRIPTION)


class SlowLink(Spec):
    """One node's scale-up fabric (``nvlink``) or network interfaces (``nic``) at ``speed`` of their bandwidth."""

    node: int = Field(ge=0, description="node index, counting from 0 in rank order")
    link: Literal["nvlink", "nic"] = Field(description="nvlink: the node's scale-up fabric; nic: its NICs")
    speed: float = Field(gt=0, le=1, description=SPEED_DESCRIPTION)


_SHORT = re.compile(r"^\s*(\d+)\s*(?::\s*([a-z]+)\s*)?@\s*([0-9.eE+-]+)\s*$")


def _short_form(value: Any, key: str, with_link: bool) -> Any:
    """``"12@0.5"`` (or ``"1:nic@0.5"`` for a link) as the mapping it stands for; a mapping unchanged."""
    example = "1:nic@0.5" if with_link else "12@0.5"
    if isinstance(value, (dict, Spec)):  # a mapping, or an entry built already (from Python)
        return value
    if not isinstance(value, str):  # a bare number says which part but not how slow
        raise ValueError(f"{value!r} is not a {key} with its speed: write {example!r} or "
                         f"{{{key}: ..., {'link: ..., ' if with_link else ''}speed: ...}}")
    match = _SHORT.match(value)
    if match is None or bool(match.group(2)) != with_link:
        raise ValueError(f"{value!r} is not of the form {example!r} ({key}{':link' if with_link else ''}@speed)")
    try:
        speed = float(match.group(3))
    except ValueError:
        raise ValueError(f"{value!r}: the speed {match.group(3)!r} is not a number") from None
    found: dict[str, Any] = {key: int(match.group(1)), "speed": speed}
    if with_link:
        found["link"] = match.group(2)
    return found


def _as_list(value: Any, key: str, with_link: bool) -> Any:
    """One entry or a list of entries, each a mapping or its short form; a part named twice is
    refused (which of its two speeds would hold?)."""
    items = value if isinstance(value, list) else [value]
    entries = [_short_form(item, key, with_link) for item in items]
    seen: set = set()
    for entry in entries:
        fields = entry if isinstance(entry, dict) else vars(entry)
        part = (fields.get(key), fields.get("link"))
        if part in seen:
            what = f"{key} {part[0]}" + (f" {part[1]}" if with_link else "")
            raise ValueError(f"{what} is given twice; give each once with its speed")
        seen.add(part)
    return entries


class FaultsSpec(Spec):
    """The degraded parts of the cluster; empty by default (every part healthy)."""

    slow_gpu: list[SlowGpu] = Field(default_factory=list, description="GPUs at a fraction of their speed")
    slow_node: list[SlowNode] = Field(default_factory=list, description="nodes whose GPUs all run slower")
    slow_link: list[SlowLink] = Field(default_factory=list, description="a node's NVLink or NICs at a fraction")

    @field_validator("slow_gpu", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        return _as_list(value, "rank", False)

    @field_validator("slow_node", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        return _as_list(value, "node", False)

    @field_validator("slow_link", mode="before")
    @classmethod
    def _links(cls, value: Any) -> Any:
        return _as_list(value, "node", True)

    @property
    def degraded(self) -> bool:
        """Whether any part is slower than healthy."""
        return any(item.speed < 1.0 for item in (*self.slow_gpu, *self.slow_node, *self.slow_link))

    def check_cluster(self, devices: int, devices_per_node: int) -> None:
        """Every named rank and node exists in a cluster of ``devices`` (InputError naming the entry if not)."""
        nodes = -(-devices // devices_per_node)
        for index, gpu in enumerate(self.slow_gpu):
            if gpu.rank >= devices:
                raise InputError(f"rank {gpu.rank} does not exist; the cluster has {devices} devices "
                                 f"(ranks 0 to {devices - 1})", field=f"faults.slow_gpu.{index}.rank")
        for name, items in (("slow_node", self.slow_node), ("slow_link", self.slow_link)):
            for index, item in enumerate(items):
                if item.node >= nodes:
                    raise InputError(f"node {item.node} does not exist; the cluster has {nodes} nodes "
                                     f"(0 to {nodes - 1})", field=f"faults.{name}.{index}.node")
