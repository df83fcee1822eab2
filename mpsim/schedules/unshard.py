"""Which passes gather their parameters when FSDP runs under a pipeline schedule.

FSDP2 shards each model chunk's parameters over the data-parallel ranks. Driven by
``torch.distributed.pipelining``, a chunk's passes gather and free them by two rules of
FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py) and one of the pipeline
(``backward_maybe_with_nosync``, torch/distributed/pipelining/stage.py):

* a pass's pre-hook gathers the parameters unless they are already unsharded
  (``pre_forward`` and ``pre_backward`` call ``unshard``, which returns at once then);
* a forward frees them after it, with ``reshard_after_forward`` (``post_forward``);
* a backward keeps them: every backward but the chunk's last runs with
  ``set_reshard_after_backward(False)``, and a weight-gradient pass (``W``) does not
  touch them.

So in 1F1B's steady phase a forward follows its chunk's backward and gathers nothing,
while the backward after it gathers again: one gather per microbatch, not two. A chunk's
first forward finds its parameters gathered at the start of the step (the runtime's
``UNSHARD`` actions, or FSDP's pre-forward hook issued while the rank waits for its input),
which ``simulate.overlapped_param_gather_s`` prices.

The runtime adds a window (``_add_unshard_reshard`` in
torch/distributed/pipelining/schedules.py, ``max_active_stages``, 3): before each compute
action it keeps gathered only the next ``window`` distinct chunks the rank's list computes
from that action on, freeing (``RESHARD``) any other and gathering (``UNSHARD``) those not
yet gathered. With at most ``window`` chunks per rank a chunk is only freed after its last
pass; with more (interleaved schedules with ``vpp`` over 3), chunks leave the window and
come back, each return one more gather of the whole chunk, and a rank holds at most
``window`` chunks' parameters at once (``Gathering.window``, ``parallel.fsdp_gathered_chunks``).
A chunk gathered again after the step's start is gathered as the runtime comes to the item
it enters the window before, at least one item ahead of the chunk's next pass, and that
pass waits for it (``rank_gathers``' ``regathers``; priced in ``cost/chunk_gathers.py``,
waited for by the engine: ``EngineInput.gathered_after``).

Without ``reshard_after_forward`` and without a window that binds, no pass gathers
(``Layout.fsdp_whole_step``), and the schedule is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpsim.schedules.actions import Action, Item, Overlapped, Schedule, Unsharding, flat, parts, stages_by_rank

# torch.distributed.pipelining's runtime keeps at most this many of a rank's chunks gathered
# (_add_unshard_reshard's max_active_stages default, torch/distributed/pipelining/schedules.py)
TORCH_GATHERED_CHUNKS = 3


@dataclass(frozen=True)
class Gathering:
    """How FSDP under a pipeline gathers and frees a rank's chunks' parameters within a step."""

    reshard_after_forward: bool  # a forward frees what it used; the backward after gathers again
    window: int | None = None  # the runtime keeps at most this many chunks gathered; None: all of them


def gathers(stage: int, kind: str, resident: set[int]) -> bool:
    """Whether a pass of ``kind`` on ``stage`` gathers the stage's parameters; ``resident`` (the
    stages whose parameters are gathered) follows what the pass leaves: a forward frees what it
    used, a backward keeps it, a weight-gradient pass does not touch it."""
    if kind == "W":
        return False
    gathered = stage not in resident
    if kind == "F":
        resident.discard(stage)
    else:
        resident.add(stage)
    return gathered


def _hooks(stage: int, kind: str, resident: set[int]) -> tuple[bool, int]:
    """(whether the pass gathers, -1 / +1 / 0: it frees its stage after it, keeps what it gathered,
    neither) under FSDP's hooks with ``reshard_after_forward``; ``resident`` follows (``gathers``).
    A forward that gathers frees again after it: no change."""
    gathered = gathers(stage, kind, resident)
    if kind == "F" and not gathered:
        return gathered, -1
    if kind in ("B", "I") and gathered:
        return gathered, 1
    return gathered, 0


def _stages_of(item: Item) -> tuple[int, ...]:
    return tuple(action.stage for action in parts(item))


def window_changes(items: list[Item] | tuple[Item, ...], window: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(freed, gathered) before each item of a rank's list, as ``_add_unshard_reshard`` lowers it.

    Before each item the runtime looks ahead for the next ``window`` distinct stages the list
    computes from that item on (an overlapped pair's two stages counted together, so a pair
    can make it ``window + 1``), frees the gathered stages not among them and gathers those
    not yet gathered, in the order they come. What it gathers before the first item is what
    the step starts with.
    """
    count = len(items)
    # per item, where each stage is next computed from it on: one backward sweep
    upcoming: dict[int, int] = {}
    ahead_of: list[tuple[int, ...]] = [()] * count
    for index in range(count - 1, -1, -1):
        for stage in _stages_of(items[index]):
            upcoming[stage] = index
        # the stages by where they come next (a pair's in its own order), cut where `window` are reached
        order = sorted(upcoming, key=lambda stage: (upcoming[stage], _position(items[upcoming[stage]], stage)))
        chosen: list[int] = []
        for position, stage in enumerate(order):
            if len(chosen) >= window and upcoming[stage] != upcoming[order[position - 1]]:
                break
            chosen.append(stage)
        ahead_of[index] = tuple(chosen)
    changes = []
    active: list[int] = []
    for index in range(count):
        ahead = ahead_of[index]
        freed = tuple(stage for stage in active if stage not in ahead)
        gathered = tuple(stage for stage in ahead if stage not in active)
        active = [stage for stage in active if stage in ahead] + list(gathered)
        changes.append((freed, gathered))
    return changes


def _position(item: Item, stage: int) -> int:
    return _stages_of(item).index(stage)


@dataclass(frozen=True)
class RankGathers:
    """Where a rank's gathered parameters come and go, per compute action of ``flat(items)``."""

    start: tuple[int, ...]  # stages gathered when the step starts
    before: tuple[tuple[tuple[int, int], ...], ...]  # per action: (stage, -1 freed / +1 gathered) by the runtime first
    change: tuple[int, ...]  # per action: -1 it frees its stage, +1 it gathers it (FSDP's hooks), 0
    marked: tuple[bool, ...]  # per action: priced as gathering its parameters first (``Unsharding``)
    freed_after: tuple[tuple[int, ...], ...]  # per action: stages freed once it has ended
    # the runtime's gathers after the step's start: (item it is issued before, stage, first item on
    # the stage from there, which waits for it), in the order issued
    regathers: tuple[tuple[int, int, int], ...] = ()


def rank_gathers(items: list[Item] | tuple[Item, ...], held: list[int], gathering: Gathering) -> RankGathers:
    """``RankGathers`` of one rank's list (``held``: the stages the rank holds).

    Without a window that binds (``window`` None or at least the rank's chunks): every stage
    is gathered when the step starts, FSDP's hooks free and gather (``gathers``) and a
    stage's last pass frees it once it ends. With one, the runtime's window decides what is
    gathered (``window_changes``), FSDP's hooks free after a forward and gather for a
    backward within it, and what is left gathered is freed after the list's last action.
    """
    actions = flat(items)
    count = len(actions)
    before: list[tuple[tuple[int, int], ...]] = [()] * count
    change = [0] * count
    marked = [False] * count
    freed_after: list[tuple[int, ...]] = [()] * count
    window = gathering.window
    if window is None or len(held) <= window:
        resident = set(held)
        last_pass = {action.stage: index for index, action in enumerate(actions) if action.kind != "F"}
        for index, (stage, kind, _) in enumerate(actions):
            if gathering.reshard_after_forward:
                marked[index], change[index] = _hooks(stage, kind, resident)
            if last_pass.get(stage) == index and stage in resident:
                resident.discard(stage)
                freed_after[index] = (stage,)
        return RankGathers(tuple(held), tuple(before), tuple(change), tuple(marked), tuple(freed_after))
    lowered = window_changes(items, window)
    start = lowered[0][1] if lowered else ()
    resident = set(start)
    issued: list[tuple[int, int]] = []  # (item, stage) of each gather after the step's start
    index = 0
    for position, item in enumerate(items):
        freed, gathered = lowered[position] if position else ((), ())
        steps = [(stage, -1) for stage in freed if stage in resident]
        resident.difference_update(freed)
        for stage in gathered:
            if stage not in resident:
                resident.add(stage)
                issued.append((position, stage))
                steps.append((stage, 1))
        before[index] = tuple(steps)
        for stage, kind, _ in parts(item):
            if gathering.reshard_after_forward:  # FSDP's hooks within the window
                marked[index], change[index] = _hooks(stage, kind, resident)
            index += 1
    if count:
        freed_after[count - 1] = tuple(sorted(resident))
    # each gather's chunk is waited for by its next item (torch's _assert_unsharded, before any pass)
    issued_at: dict[int, list[int]] = {}
    for at, stage in issued:
        issued_at.setdefault(at, []).append(stage)
    next_use: dict[int, int] = {}
    first_use: dict[tuple[int, int], int] = {}
    for position in range(len(items) - 1, -1, -1):
        for stage in _stages_of(items[position]):
            next_use[stage] = position
        for stage in issued_at.get(position, ()):
            first_use[(position, stage)] = next_use[stage]
    regathers = tuple((at, stage, first_use[(at, stage)]) for at, stage in issued)
    return RankGathers(tuple(start), tuple(before), tuple(change), tuple(marked), tuple(freed_after), regathers)


def _marked(action: Action, gather: bool) -> Action:
    return Unsharding(*action) if gather else action


def mark_unsharding(schedule: Schedule, gathering: Gathering = Gathering(reshard_after_forward=True)) -> Schedule:
    """``schedule`` with every action that gathers its stage's parameters first as ``Unsharding``
    (FSDP under a pipeline: module doc; by default FSDP2's own, resharding after the forward,
    with every chunk kept by the runtime)."""
    ranks = []
    for items, held in zip(schedule.actions, stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)):
        marks = iter(rank_gathers(items, held, gathering).marked)
        marked: list[Item] = []
        for item in items:
            if isinstance(item, Overlapped):
                # torch runs the pair's forward, then its backward
                marked.append(Overlapped(_marked(item.forward, next(marks)), _marked(item.backward, next(marks))))
            else:
                marked.append(_marked(item, next(marks)))
        ranks.append(tuple(marked))
    return replace(schedule, actions=tuple(ranks))
