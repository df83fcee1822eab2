"""The pieces of an action, built when something reads them.

An action's price is mostly its duration and what it is made of in totals (compute,
exposed communication); only the outputs that draw an action from the inside (traces,
timeline plots, the HTML report, trace validation) read its pieces one by one. A pass of
a deep stage has thousands of them: one per kernel of every layer. So a price keeps its
pieces as a short recipe and :class:`Segments` builds the tuple of :class:`Segment` on
first read, once.

A recipe is a list of parts, each either a ready :class:`Segment` or a *block*: one
layer's (or head's, or embedding's) label and category, a template of its ops, and where
each of its items (an op, a collective, or a collective with the ops it overlaps) starts
in the action. A stage's layers run the same ops, so a pass prices each distinct block
once and places it again (``CostModel._price``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Iterator, Union


@dataclass(frozen=True)
class Segment:
    """A piece of an action: a compute op, or a collective on the TP or DP stream."""

    stream: str  # "compute", "tp" (collectives on the critical path or overlapped), "dp"
    category: str  # "forward", "backward", "recompute", "weight-grad", "tp-comm", "dp-comm"
    label: str
    offset_s: float
    duration_s: float


# one op of a block's template: (stream, op name, index of its item in the block, offset from
# the item's start, seconds)
TemplateOp = tuple[str, str, int, float, float]


@dataclass(frozen=True)
class BlockPart:
    """A block's ops, its items starting at ``starts`` (seconds into the action)."""

    label: str
    category: str
    template: tuple[TemplateOp, ...]
    starts: tuple[float, ...]

    def segments(self) -> Iterator[Segment]:
        for stream, name, item, offset_s, duration_s in self.template:
            category = self.category if stream == "compute" else "tp-comm"
            yield Segment(stream, category, f"{self.label} {name}", self.starts[item] + offset_s, duration_s)


Part = Union[Segment, BlockPart]


class Segments(Sequence):
    """An action's segments, built from their recipe on first read (module doc); compares equal to
    the tuple it builds, and adds to tuples like one."""

    __slots__ = ("_parts", "_built")

    def __init__(self, parts: Sequence[Part] = ()):
        self._parts: tuple[Part, ...] | None = tuple(parts)
        self._built: tuple[Segment, ...] | None = None

    def built(self) -> tuple[Segment, ...]:
        """The segments, in order."""
        if self._built is None:
            out: list[Segment] = []
            for part in self._parts or ():
                if isinstance(part, Segment):
                    out.append(part)
                else:
                    out.extend(part.segments())
            self._built, self._parts = tuple(out), None
        return self._built

    def __len__(self) -> int:
        return len(self.built())

    def __getitem__(self, index):  # type: ignore[override]
        return self.built()[index]

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.built())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Segments):
            return self.built() == other.built()
        if isinstance(other, tuple):
            return self.built() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.built())

    def __add__(self, other: Sequence[Segment]) -> tuple[Segment, ...]:
        return self.built() + tuple(other)

    def __radd__(self, other: Sequence[Segment]) -> tuple[Segment, ...]:
        return tuple(other) + self.built()

    def __repr__(self) -> str:
        return f"Segments({self.built()!r})"

    def __reduce__(self):
        return Segments, (self.built(),)
