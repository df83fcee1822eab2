"""Which kernels the fit may see, and which it is judged on: a split by shape.

A training step runs the same GEMM shapes and message sizes over and over. Holding out
kernels at random would leave every held-out shape's twins in the fitted half, and a
model that memorised shapes would look perfect. So the split is by key, the GEMM's
``(dtype, batch, m, n, k)`` or the collective's ``(kind, algorithm, protocol, ranks,
bytes)``: the distinct keys are sorted and every ``HOLD_OUT_EVERY``-th of them (the 2nd,
5th, 8th, ...) goes to the held-out half with every kernel that has it. Sorting makes the
split deterministic and spreads the held-out keys across the range of sizes.

Collectives are split within each line that is fitted (one kind, algorithm, protocol
and group), so a line with several sizes keeps some on both sides.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

HOLD_OUT_EVERY = 3  # every third distinct key is held out: a third of the shapes
HOLD_OUT_RULE = (f"distinct keys sorted, every {HOLD_OUT_EVERY}rd held out starting with the 2nd "
                 f"(GEMMs by dtype and shape, collectives by size within each kind, algorithm, protocol and group)")


def held_out_keys(keys, every: int = HOLD_OUT_EVERY) -> set:
    """The keys to hold out: every ``every``-th of the sorted distinct keys, starting with the second."""
    ordered = sorted(set(keys))
    return {key for index, key in enumerate(ordered) if index % every == 1 % every}


def split_by_key(items: Sequence[T], key: Callable[[T], tuple], group: Callable[[T], tuple] | None = None,
                 every: int = HOLD_OUT_EVERY) -> tuple[list[T], list[T]]:
    """``(fitted, held_out)``: items split by their key, within each group when ``group`` is given."""
    groups: dict[tuple, list[T]] = defaultdict(list)
    for item in items:
        groups[group(item) if group is not None else ()].append(item)
    held: set = set()
    for members in groups.values():
        held |= held_out_keys([key(item) for item in members], every)
    fitted = [item for item in items if key(item) not in held]
    return fitted, [item for item in items if key(item) in held]
