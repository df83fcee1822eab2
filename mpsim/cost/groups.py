"""The process groups of a layout and where their ranks sit.

Global ranks are numbered with the plan's order, innermost first (``tp-cp-dp-pp`` by
default). Dense parameters are replicated over data and context parallelism, so their
gradients are reduced over the ``dp`` x ``cp`` ranks ("dp" below); ZeRO shards over a
subset of those ("zero") and, with hybrid sharding, reduces across the shards
("zero-replica"). Transformer Engine reduces fp8 amaxes over tensor x context x data
parallelism ("amax"). Experts follow Megatron's expert layout: expert tensor parallelism
innermost, then expert parallelism, then the expert data-parallel replicas.
"""

from __future__ import annotations

from mpsim.cost.topology import GroupPlacement, place_ranks
from mpsim.specs.layout import Layout


def _ranks(layout: Layout, dims: list[tuple[str, int]]) -> list[int]:
    """Ranks of the group spanning the first ``size`` members along each ``dim``, from rank 0."""
    ranks = [0]
    for dim, size in dims:
        stride = layout.stride(dim)
        ranks = [rank + i * stride for rank in ranks for i in range(size)]
    return ranks


def group_ranks(layout: Layout) -> dict[str, list[int]]:
    """Every named group (containing rank 0) as a list of global ranks."""
    shard = layout.zero_shard_size
    dp_stride = layout.stride("dp")
    return {
        "tp": _ranks(layout, [("tp", layout.tp)]),
        "cp": _ranks(layout, [("cp", layout.cp)]),
        "pp": _ranks(layout, [("pp", layout.pp)]),
        "dp": _ranks(layout, [("cp", layout.cp), ("dp", layout.dp)]),
        "zero": _ranks(layout, [("cp", layout.cp), ("dp", shard)]),
        "zero-replica": [i * shard * dp_stride for i in range(layout.dp // shard)],
        # Megatron-Core's fp8 amax reduction group: tensor x context x data parallel
        "amax": _ranks(layout, [("tp", layout.tp), ("cp", layout.cp), ("dp", layout.dp)]),
        "etp": list(range(layout.etp)),
        "ep": [i * layout.etp for i in range(layout.ep)],
        "edp": [i * layout.etp * layout.ep for i in range(layout.expert_dp)],
    }


def group_placements(layout: Layout) -> dict[str, GroupPlacement]:
    """Placement on nodes of every named group, standing for its copies in the job."""
    # place_ranks remembers each placement by its exact inputs: layouts with the same groups
    # share the (frozen) placement objects
    return {name: place_ranks(ranks, layout.devices_per_node, layout.devices)
            for name, ranks in group_ranks(layout).items()}
