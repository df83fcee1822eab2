"""DualPipeV (DeepSeek-V3, torch's ``ScheduleDualPipeV``): a V of two chunks per rank.

Each rank holds stages ``r`` and ``2p-1-r``. In the steady state it runs the forward of
one chunk and the backward of the other as one overlapped step, so that each one's
communication hides under the other's compute (DeepSeek overlaps the MoE all-to-all
this way). Its warm-up and cool-down borrow zero-bubble's split backward: part of the
backwards run as ``I`` with their ``W`` deferred into the gaps.

The order below reproduces torch 2.13's generator step by step: warm-up forwards,
paired forwards, input-gradient/weight/forward triples, the overlapped main phase, and
a cool-down that switches from full to split backwards half way.
"""

from __future__ import annotations

from collections import defaultdict

from mpsim.schedules.actions import Action, Item, Overlapped, Schedule
from mpsim.schedules.zero_bubble import v_placement


def dualpipev(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """DualPipeV in torch's order; needs two chunks per rank and at least ``2*pp`` microbatches."""
    if vpp != 2:
        raise ValueError(f"dualpipev places exactly two chunks per rank in a V; set vpp to 2 (got {vpp})")
    if num_microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs at least 2 x pp = {2 * pp} microbatches, got {num_microbatches}")
    ranks = []
    for rank in range(pp):
        down, up = rank, 2 * pp - 1 - rank
        forwards: dict[int, int] = defaultdict(int)
        backwards: dict[int, int] = defaultdict(int)  # microbatch counter shared by B and I
        pending_weights: list[Action] = []
        items: list[Item] = []

        def forward(stage: int) -> Action:
            action = Action(stage, "F", forwards[stage])
            forwards[stage] += 1
            return action

        def backward(stage: int, split: bool = False) -> Action:
            action = Action(stage, "I" if split else "B", backwards[stage])
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
                # the last rank runs its first pair unoverlapped to shorten the bubble
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
        ranks.append(tuple(items))
    return Schedule("dualpipev", num_microbatches, v_placement(pp), tuple(ranks))
