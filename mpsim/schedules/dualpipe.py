"""DualPipe and DualPipeV (DeepSeek-V3): overlapped forward+backward steps, two chunks per rank.

DualPipeV (torch's ``ScheduleDualPipeV``) is a V: each rank holds stages ``r`` and
``2p-1-r`` of one chain of ``2p`` stages. In the steady state it runs the forward of
one chunk and the backward of the other as one overlapped step, so that each one's
communication hides under the other's compute (DeepSeek overlaps the MoE all-to-all
this way). Its warm-up and cool-down borrow zero-bubble's split backward: part of the
backwards run as ``I`` with their ``W`` deferred into the gaps.

DualPipe, the bidirectional original (DeepSeek-V3 report Sec. 3.2.1, Figure 5, Table 2;
reference implementation ``dualpipe/dualpipe.py`` of github.com/deepseek-ai/DualPipe),
runs two pipelines over the same ``p`` layer blocks: direction 0 sends block ``k`` to
rank ``k``, direction 1 to rank ``p-1-k``, and half of the microbatches enter from each
end. Its stages are two chains (``chains.py``): stage ``k`` is block ``k`` of direction
0 on rank ``k``, stage ``p+k`` block ``k`` of direction 1 on rank ``p-1-k``. So rank
``r`` holds stages ``r`` and ``2p-1-r``, as in the V, and holds two blocks' parameters.
Rank ``r`` and rank ``p-1-r`` run the same program mirrored: with ``h = min(r, p-1-r)``
the rank's order is DualPipeV's for rank ``h`` of ``p/2`` over ``m/2`` microbatches,
its first chunk being the direction whose data reaches it first (direction 0 on the
first half of the ranks, direction 1 on the second half). Both follow the reference's
eight phases: warm-up forwards, paired forwards of both chunks, input-gradient /
weight / forward triples, the overlapped main phase, backward + overlapped steps, a
cool-down that switches from full to split backwards half way, then the deferred
weight gradients.

The DualPipeV order reproduces torch 2.13's generator step by step.
"""

from __future__ import annotations

from collections import defaultdict

from mpsim.schedules.actions import Action, Item, Overlapped, Schedule
from mpsim.schedules.zero_bubble import v_placement


def _v_rank_items(pp: int, rank: int, num_microbatches: int, down: int, up: int,
                  first_microbatch: dict[int, int]) -> list[Item]:
    """One rank's order in the V of ``pp`` ranks over ``num_microbatches`` per chunk.

    ``down`` is the chunk whose forwards reach the rank first, ``up`` the other one;
    ``first_microbatch`` offsets each stage's microbatch numbers (DualPipe's second
    direction carries the second half of the microbatches).
    """
    forwards: dict[int, int] = defaultdict(int)
    backwards: dict[int, int] = defaultdict(int)  # microbatch counter shared by B and I
    pending_weights: list[Action] = []
    items: list[Item] = []

    def forward(stage: int) -> Action:
        action = Action(stage, "F", first_microbatch.get(stage, 0) + forwards[stage])
        forwards[stage] += 1
        return action

    def backward(stage: int, split: bool = False) -> Action:
        action = Action(stage, "I" if split else "B", first_microbatch.get(stage, 0) + backwards[stage])
        backwards[stage] += 1
        if split:
            pending_weights.append(Action(stage, "W", action.microbatch))
        return action

    def weight() -> None:
        if pending_weights:
            items.append(pending_weights.pop(0))

    for _ in range(2 * (pp - rank - 1)):
        items.append(forward(down))
    for _ in range(rank + 1):
        items += [forward(down), forward(up)]
    for _ in range(pp - rank - 1):
        items.append(backward(up, split=True))
        weight()
        items.append(forward(up))
    for step in range(num_microbatches - 2 * pp + rank + 1):
        if step == 0 and rank == pp - 1:
            # the middle rank runs its first pair unoverlapped to shorten the bubble
            items += [forward(down), backward(up)]
        else:
            items.append(Overlapped(forward(down), backward(up)))
        items.append(Overlapped(forward(up), backward(down)))
    for _ in range(pp - rank - 1):
        items.append(backward(up))
        items.append(Overlapped(forward(up), backward(down)))
    split = False
    for step in range(rank + 1):
        if step == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        items.append(backward(up, split))
        if step == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        items.append(backward(down, split))
    for _ in range(pp - rank - 1):
        weight()
        items.append(backward(down, split))
    for _ in range(rank + 1):
        weight()
    return items


def dualpipev(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """DualPipeV in torch's order; needs two chunks per rank and at least ``2*pp`` microbatches."""
    if vpp != 2:
        raise ValueError(f"dualpipev places exactly two chunks per rank in a V; set vpp to 2 (got {vpp})")
    if num_microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs at least 2 x pp = {2 * pp} microbatches, got {num_microbatches}")
    ranks = tuple(tuple(_v_rank_items(pp, rank, num_microbatches, rank, 2 * pp - 1 - rank, {}))
                  for rank in range(pp))
    return Schedule("dualpipev", num_microbatches, v_placement(pp), ranks)


def dualpipe(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """Bidirectional DualPipe: two chains of ``pp`` stages, ``num_microbatches / 2`` entering each end.

    The reference implementation asks for an even number of ranks and an even number of
    microbatches, at least twice the ranks; so does this generator.
    """
    if vpp != 2:
        raise ValueError(f"dualpipe holds two chunks per rank (one per direction); set vpp to 2 (got {vpp})")
    if pp < 2 or pp % 2:
        raise ValueError(f"dualpipe pairs rank r with rank pp-1-r, so parallel.pp must be even (got {pp})")
    if num_microbatches % 2 or num_microbatches < 2 * pp:
        raise ValueError(f"dualpipe splits the microbatches over two directions and needs an even number of at "
                         f"least 2 x pp = {2 * pp} (parallel.global_batch_size / (dp x microbatch_size)), "
                         f"got {num_microbatches}")
    half_ranks, half = pp // 2, num_microbatches // 2
    ranks = []
    for rank in range(pp):
        forward_stage, reverse_stage = rank, 2 * pp - 1 - rank  # direction 0's and direction 1's chunk
        # the direction whose inputs arrive first leads: 0 on the first half of the ranks
        down, up = (forward_stage, reverse_stage) if rank < half_ranks else (reverse_stage, forward_stage)
        offsets = {forward_stage: 0, reverse_stage: half}
        ranks.append(tuple(_v_rank_items(half_ranks, min(rank, pp - 1 - rank), half, down, up, offsets)))
    return Schedule("dualpipe", num_microbatches, v_placement(pp), tuple(ranks), chains=(pp, pp))
