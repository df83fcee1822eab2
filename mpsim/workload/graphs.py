"""Partial CUDA graphs: the kernels a layer replays from a captured graph.

Megatron-Core can capture parts of every transformer layer in CUDA graphs
(``--cuda-graph-impl transformer_engine`` or ``local`` with ``--cuda-graph-modules``;
``training.cuda_graph_modules`` here): the attention (``attn``), a dense layer's MLP
(``mlp``), a MoE layer's norm, router and shared experts (``moe_router``) and the dispatcher's
preprocessing (``moe_preprocess``), or a whole MoE block padded to capacity (``moe``)
(``CudaGraphModule`` in megatron/core/transformer/transformer_config.py). A captured part is
replayed with one launch: its kernels run as they would eagerly, but the host pays one
launch for the run of them, forward and backward, instead of one per kernel
(``Op.graph``). What follows a replay eagerly is launched one kernel at a time as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from mpsim.workload.blocks import BlockWork
from mpsim.workload.ops import Item, Op, Overlap


def _marked(item: Item, mark: str) -> Item:
    if isinstance(item, Overlap):
        return replace(item, comm=replace(item.comm, graph=mark),
                       compute=tuple(replace(op, graph="in") for op in item.compute))
    return replace(item, graph=mark)


def in_graph(items: tuple[Item, ...], captured: Callable[[Item], bool]) -> tuple[Item, ...]:
    """``items`` with the ``captured`` ones replayed from a graph: the first of each run of them
    a graph launch ("start"), the others launched with it ("in")."""
    marked: list[Item] = []
    previous = False
    for item in items:
        inside = captured(item)
        marked.append(_marked(item, "in" if previous else "start") if inside else item)
        previous = inside
    return tuple(marked)


def graphed_block(work: BlockWork, captured: Callable[[Item], bool] = lambda item: True) -> BlockWork:
    """A block whose ``captured`` items (all, by default) run in CUDA graphs, forward, backward
    and what selective recompute runs again."""
    return replace(work, forward=in_graph(work.forward, captured), backward=in_graph(work.backward, captured),
                   backward_input=in_graph(work.backward_input, captured),
                   backward_weight=in_graph(work.backward_weight, captured),
                   recompute_selective=in_graph(work.recompute_selective, captured),
                   recompute_parts=tuple((module, in_graph(items, captured), dropped)
                                         for module, items, dropped in work.recompute_parts))


def captured_ops(*groups) -> Callable[[Item], bool]:
    """A predicate: the ops among ``groups`` (ops or runs of them), before any is marked."""
    ops = {item for group in groups for item in (group if isinstance(group, (list, tuple)) else (group,))
           if isinstance(item, Op)}
    return lambda item: isinstance(item, Op) and item in ops
