"""Pass prices shared between cost models: a pass priced once for every model that would price it alike.

Layouts that differ in ways a pass does not see (a ZeRO stage below 3, the pipeline depth
at the same layers per stage) build equal passes as distinct objects, each priced by the
cost model of its own layout. While ``sharing`` is active (the planner turns it on),
``CostModel.price`` looks a pass up by its content and by every other input it reads, and
prices it only when no model priced it alike before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from mpsim.workload.ops import Overlap, Pass

memo: dict | None = None  # while ``sharing``: pass content -> (groups it reads, {inputs -> (objects, cost)})
SHARED_PASSES = 4096


@contextmanager
def sharing(prices: dict) -> Iterator[dict]:
    """While the block runs, cost models share their prices of equal passes in ``prices``.

    Layouts that differ in ways a pass does not see (a ZeRO stage below 3, the pipeline
    depth at the same layers per stage) build equal passes as distinct objects, each
    priced by its own model. ``CostModel.price`` reads, besides the pass and the compute
    scale: the system (links, accelerator, the SMs a collective takes), the calibration,
    the dtype and speed of the compute model, the host's launch pace and whether passes
    start cold, and the placement of each group the pass runs collectives in. A shared
    price is keyed on the pass's content and on those (objects by identity, held by the
    entry), so it is used only where a model of its own would compute the same numbers.
    """
    global memo
    before, memo = memo, prices
    try:
        yield prices
    finally:
        memo = before


def _groups_used(work: Pass) -> tuple[str, ...]:
    """The groups whose placements pricing ``work`` reads (gathers, releases, collectives)."""
    groups = set()
    for block in work:
        groups.update(op.group for op in (block.gather, block.release) if op is not None)
        for item in block.items:
            if isinstance(item, Overlap):
                groups.add(item.comm.group)
            elif item.kind == "collective":
                groups.add(item.group)
    return tuple(sorted(groups))


class _Content:
    """A pass as a dictionary key: equal to another holding an equal pass (compared in full),
    hashed on its length and its first and last blocks only. Equal passes hash alike; hashing
    every block of every pass looked up cost more than a third of what sharing saved."""

    __slots__ = ("work", "_hash")

    def __init__(self, work: Pass):
        self.work = work
        self._hash = hash((len(work), work[0], work[-1])) if work else 0

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Content) and (self.work is other.work or self.work == other.work)


def price(model: Any, work: Pass, compute_scale: float) -> Any:
    """``model``'s price of ``work`` (a ``CostModel`` and the ``ActionCost`` it returns; not
    imported, since ``cost.actions`` imports this module): another model's, when it was
    priced alike, else its own."""
    assert memo is not None
    content = _Content(work)
    entry = memo.get(content)  # equal passes meet here, whatever object each is
    if entry is None:
        if len(memo) >= SHARED_PASSES:
            memo.clear()
        entry = memo[content] = (_groups_used(work), {})
    groups, prices = entry
    training = model.scenario.training
    held = (model.system, model.calibration, *(model.placements[group] for group in groups))
    key = (compute_scale, training.dtype, training.attention_kernel, model.compute_speed, model.host_launch_forward_s,
           model.host_launch_backward_s, training.host_sync_between_passes, *map(id, held))
    known = prices.get(key)
    if known is not None and all(a is b for a, b in zip(known[0], held)):
        return known[1]
    cost = model._price(work, compute_scale)
    prices[key] = (held, cost)
    return cost
