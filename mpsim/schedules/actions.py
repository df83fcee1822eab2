"""A pipeline schedule as data: an ordered list of compute actions per rank.

An action is ``(stage, kind, microbatch)`` and prints the way
``torch.distributed.pipelining`` prints it: ``0F3`` is the forward of stage 0 on
microbatch 3, ``1B3`` its full backward, ``1I3`` the input-gradient half and ``1W3``
the weight-gradient half. Stages are global model-chunk indices; a rank may hold
several (interleaved, V-shaped schedules). The engine runs any valid schedule, so a new
schedule is a new list, never an engine change.

Stages normally form one pipeline; ``Schedule.chains`` splits them into several (the
bidirectional DualPipe runs two, ``chains.py``). The text form then starts with a
directive line, ``# chains: 4 4``, which older readers skip as a comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple, Union

from mpsim.paths import read_text
from mpsim.schedules.chains import StageChains

KINDS = ("F", "B", "I", "W")


class Action(NamedTuple):
    """One compute action: run ``kind`` of ``stage`` for ``microbatch``."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


class Unsharding(Action):
    """An action that first all-gathers its stage's sharded parameters (FSDP under a pipeline).

    It prints, compares and unpacks as the plain action; only its price differs
    (``engine.core.duration_key``). ``mpsim/schedules/unshard.py`` says which actions gather.
    """

    __slots__ = ()


GATHERING = "+gather"  # the suffix of an unsharding action's kind in its duration key


def priced_kind(action: Action) -> str:
    """The kind an action is priced as: its kind, with ``GATHERING`` when it is ``Unsharding``."""
    return action.kind + GATHERING if type(action) is Unsharding else action.kind


class Overlapped(NamedTuple):
    """A forward and a backward of two microbatches run as one overlapped step (DualPipe, Megatron-Core's
    combined 1F1B).

    The two share the rank's compute; each one's communication hides under the other's
    compute. Printed the way torch prints its ``OVERLAP_F_B`` action: ``(0F3;7B1)OVERLAP_F_B``.
    """

    forward: Action
    backward: Action

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})OVERLAP_F_B"


Item = Union[Action, Overlapped]


def parts(item: Item) -> tuple[Action, ...]:
    """The compute actions of a rank-list item (one, or two for an overlapped pair)."""
    return (item.forward, item.backward) if isinstance(item, Overlapped) else (item,)


def flat(items: "tuple[Item, ...] | list[Item]") -> list[Action]:
    """Every compute action of a rank list, overlapped pairs expanded (forward first)."""
    return [action for item in items for action in parts(item)]


def stages_by_rank(stage_to_rank: tuple[int, ...], num_ranks: int) -> list[list[int]]:
    """The stages each rank holds, ascending (one pass over the placement)."""
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    for stage, rank in enumerate(stage_to_rank):
        held[rank].append(stage)
    return held


def completing_items(items, stages) -> dict[int, tuple[int, ...]]:
    """Position of each of a rank's ``items`` after which the gradients of some of ``stages`` (the
    stages it holds) are final -> those stages: a stage's last backward or weight-gradient pass,
    found by a scan from the end (latest first, a pair's parts in order)."""
    left = set(stages)
    found: dict[int, tuple[int, ...]] = {}
    for position in range(len(items) - 1, -1, -1):
        if not left:
            break
        for action in parts(items[position]):
            if action.kind in ("B", "W") and action.stage in left:
                left.discard(action.stage)
                found[position] = found.get(position, ()) + (action.stage,)
    return found


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists, where each stage lives and which pipeline (chain) it is in."""

    name: str
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Item, ...], ...]
    chains: tuple[int, ...] = ()  # lengths of the stage chains in stage order; (): one chain of all stages

    @cached_property
    def topology(self) -> StageChains:
        """Previous/next stage, layer block and microbatches of each stage (``chains.py``)."""
        return StageChains(len(self.stage_to_rank), self.chains)

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    @property
    def split_backward(self) -> bool:
        """True when backward is split into input-gradient (I) and weight-gradient (W)."""
        return any(a.kind == "I" for rank in self.actions for a in flat(rank))

    def to_text(self) -> str:
        """One comma-separated line of actions per rank (the CSV torch's schedules read).

        Several chains are named on a first directive line, which torch skips as a comment.
        """
        header = f"# chains: {' '.join(str(n) for n in self.chains)}\n" if len(self.chains) > 1 else ""
        return header + "".join(",".join(str(a) for a in rank) + "\n" for rank in self.actions)


_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")
_OVERLAP = re.compile(r"^\((\d+F\d+);(\d+[BI]\d+)\)OVERLAP_F_B$")
_CHAINS = re.compile(r"^\s*#\s*chains:(.*)$")


class ScheduleTextError(ValueError):
    """A schedule text file that cannot be parsed; ``line`` is 1-based."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line


def _parse_token(token: str, line: int) -> Item:
    match = _ACTION.match(token)
    if match:
        return Action(int(match.group(1)), match.group(2), int(match.group(3)))
    pair = _OVERLAP.match(token)
    if pair:
        forward, backward = (_parse_token(part, line) for part in pair.groups())
        return Overlapped(forward, backward)  # type: ignore[arg-type]
    raise ScheduleTextError(line, f"{token!r} is not an action like 0F3, 1B3, 1I3, 1W3 or (0F3;7B1)OVERLAP_F_B")


def parse_actions(text: str) -> list[list[Item]]:
    """Parse the text form: one line per rank, actions separated by commas or spaces."""
    ranks: list[list[Item]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" in line:  # optional "rank 3:" prefix
            line = line.split(":", 1)[1]
        ranks.append([_parse_token(token, number) for token in re.split(r"[,\s]+", line) if token])
    if not ranks:
        raise ScheduleTextError(1, "no actions found")
    return ranks


def parse_chains(text: str) -> tuple[int, ...]:
    """Chain lengths from a ``# chains: 4 4`` directive line, or () when there is none."""
    for number, raw in enumerate(text.splitlines(), start=1):
        match = _CHAINS.match(raw)
        if match:
            fields = match.group(1).split()
            if not fields or not all(f.isdigit() and int(f) > 0 for f in fields):
                raise ScheduleTextError(number, f"'# chains:' needs positive stage counts like '# chains: 4 4', "
                                                f"got {match.group(1).strip()!r}")
            return tuple(int(f) for f in fields)
    return ()


def schedule_from_text(text: str, name: str = "file") -> Schedule:
    """Build a schedule from its text form; the stage of each rank is read off its actions."""
    ranks = parse_actions(text)
    chains = parse_chains(text)
    owner: dict[int, int] = {}
    for rank, actions in enumerate(ranks):
        for action in flat(actions):
            previous = owner.setdefault(action.stage, rank)
            if previous != rank:
                raise ScheduleTextError(rank + 1, f"stage {action.stage} appears on rank {previous} and rank {rank}")
    num_stages = max(owner) + 1
    missing = [s for s in range(num_stages) if s not in owner]
    if missing:
        raise ScheduleTextError(1, f"stage {missing[0]} has no actions (stages must be 0..{num_stages - 1})")
    microbatches = max(a.microbatch for actions in ranks for a in flat(actions)) + 1
    if chains and sum(chains) != num_stages:
        raise ScheduleTextError(1, f"'# chains:' lengths add up to {sum(chains)} stages, but the actions name "
                                   f"{num_stages}")
    return Schedule(name, microbatches, tuple(owner[s] for s in range(num_stages)),
                    tuple(tuple(actions) for actions in ranks), chains if len(chains) > 1 else ())


def load_schedule_file(path: Path) -> Schedule:
    """Read a schedule text file."""
    return schedule_from_text(read_text(path), name=f"file:{path.name}")
