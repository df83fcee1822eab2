"""Schedule generators: pure functions of (pp, vpp, microbatches) returning a Schedule
(interleaved 1F1B also of Megatron-Core's microbatch group size).

Each generator reproduces the per-rank order of the framework implementation it is
named after (Megatron-LM and ``torch.distributed.pipelining``), so that simulated and
real runs execute the same actions in the same order.
"""

from __future__ import annotations

from typing import Callable

from mpsim.schedules.actions import Action, Overlapped, Schedule


def loop_placement(pp: int, vpp: int) -> tuple[int, ...]:
    """Stage ``s`` on rank ``s % pp`` (Megatron's interleaved placement)."""
    return tuple(stage % pp for stage in range(pp * vpp))


def gpipe(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019): all forwards, then all backwards, in microbatch order."""
    ranks = []
    for rank in range(pp):
        forwards = [Action(rank, "F", mb) for mb in range(num_microbatches)]
        backwards = [Action(rank, "B", mb) for mb in range(num_microbatches)]
        ranks.append(tuple(forwards + backwards))
    return Schedule("gpipe", num_microbatches, loop_placement(pp, 1), tuple(ranks))


def one_f_one_b(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021): pp-1-rank warm-up forwards, then F,B pairs."""
    ranks = []
    for rank in range(pp):
        warmup = min(pp - 1 - rank, num_microbatches)
        actions = [Action(rank, "F", mb) for mb in range(warmup)]
        for i in range(num_microbatches - warmup):
            actions += [Action(rank, "F", warmup + i), Action(rank, "B", i)]
        actions += [Action(rank, "B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]
        ranks.append(tuple(actions))
    return Schedule("1f1b", num_microbatches, loop_placement(pp, 1), tuple(ranks))


def interleaved_rounds(pp: int, num_microbatches: int) -> int:
    """Microbatches per round of the interleaved schedule (``pp`` when it divides the count)."""
    rounds = max(1, num_microbatches // pp)
    if num_microbatches % rounds:
        raise ValueError(f"interleaved 1F1B needs the number of microbatches ({num_microbatches}) to be a "
                         f"multiple of its number of rounds ({rounds} = microbatches // pp)")
    return num_microbatches // rounds


def microbatch_group_problem(pp: int, num_microbatches: int, group: int) -> str | None:
    """Why Megatron-Core refuses ``group`` contiguous microbatches per chunk, or None.

    Megatron-Core's interleaved schedule takes ``--microbatch-group-size-per-virtual-pipeline-stage``
    between PP and the microbatch count, and a last, shorter group of either none or at least
    PP microbatches (``forward_backward_pipelining_with_interleaving`` in
    megatron/core/pipeline_parallel/schedules.py): a shorter one would leave a chunk waiting
    on its own microbatches' earlier chunks.
    """
    if not pp <= group <= num_microbatches:
        return (f"microbatch_group_size={group} must lie between pp ({pp}) and the microbatches per pipeline "
                f"({num_microbatches}), as Megatron-Core requires")
    last = num_microbatches % group
    if 0 < last < pp:
        return (f"microbatch_group_size={group} leaves a last group of {last} microbatches, fewer than pp ({pp}); "
                f"Megatron-Core requires the microbatches ({num_microbatches}) to be a multiple of the group "
                f"size or to leave at least pp over")
    return None


def interleave_chunks(vpp: int, num_microbatches: int, group: int) -> list[int]:
    """The chunk of each of a rank's forwards, in order (Megatron-Core's ``get_schedule_table``):
    ``group`` microbatches through chunk 0, the same through chunk 1, ..., then the next group;
    the last group holds what is left."""
    chunks: list[int] = []
    for first in range(0, num_microbatches, group):
        size = min(group, num_microbatches - first)
        for chunk in range(vpp):
            chunks.extend([chunk] * size)
    return chunks


def interleaved_1f1b(pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int | None = None,
                     combined: bool = False) -> Schedule:
    """Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM; depth-first as in torch).

    Each rank holds ``vpp`` chunks (stages ``rank + k*pp``) and runs microbatches in
    groups per chunk: ``microbatch_group_size`` of them as Megatron-Core's option of that
    name sets it, by default ``pp`` (Megatron-Core's default) or, where ``pp`` does not
    divide the microbatches, the count split evenly into ``microbatches // pp`` rounds
    (torch's schedule). Warm-up is ``(vpp-1)*group + 2*(pp-1-rank)`` forwards; each
    backward runs the chunk mirrored from the forward's position in the same order.

    ``combined``: Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``,
    megatron/core/pipeline_parallel/schedules.py and combined_1f1b.py): one forward more
    in the warm-up, so that every steady-state forward is independent of the backward it
    runs with, and each such forward and backward run as one step (``Overlapped``), the
    one's expert all-to-alls beside the other's compute. With ``pp == 1`` this is its
    schedule without pipelining: the first forward alone, then (forward ``k+1``,
    backward ``k``) pairs, then the last backward.
    """
    if microbatch_group_size is None:
        group = interleaved_rounds(pp, num_microbatches)
    else:
        problem = microbatch_group_problem(pp, num_microbatches, microbatch_group_size)
        if problem:
            raise ValueError(problem)
        group = microbatch_group_size
    chunks = interleave_chunks(vpp, num_microbatches, group)
    total = vpp * num_microbatches
    make = tuple.__new__  # Action(...) without a named tuple constructor's keyword handling
    ranks = []
    for rank in range(pp):
        warmup = min((vpp - 1) * group + 2 * (pp - 1 - rank) + int(combined), total)
        next_fwd, next_bwd = [0] * (pp * vpp), [0] * (pp * vpp)  # the next microbatch of each stage
        actions: list = []
        for step in range(total + warmup):
            forward = backward = None
            if step < total:
                stage = chunks[step] * pp + rank
                forward = make(Action, (stage, "F", next_fwd[stage]))
                next_fwd[stage] += 1
            if step >= warmup:
                stage = (vpp - 1 - chunks[step - warmup]) * pp + rank
                backward = make(Action, (stage, "B", next_bwd[stage]))
                next_bwd[stage] += 1
            if combined and forward is not None and backward is not None:
                actions.append(Overlapped(forward, backward))
            else:
                actions.extend(action for action in (forward, backward) if action is not None)
        ranks.append(tuple(actions))
    return Schedule("interleaved-1f1b", num_microbatches, loop_placement(pp, vpp), tuple(ranks))


def looped_bfs(pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """Breadth-first pipeline (Lamy-Poirier 2023): every microbatch through a chunk before the next.

    Each rank runs all forwards of its first chunk, then of its second, ...; then the
    backwards chunk by chunk in reverse, microbatches in reverse order (torch's order).
    """
    ranks = []
    for rank in range(pp):
        stages = range(rank, pp * vpp, pp)
        forwards = [Action(stage, "F", mb) for stage in stages for mb in range(num_microbatches)]
        backwards = [Action(stage, "B", mb) for stage in reversed(stages) for mb in reversed(range(num_microbatches))]
        ranks.append(tuple(forwards + backwards))
    return Schedule("looped-bfs", num_microbatches, loop_placement(pp, vpp), tuple(ranks))


Generator = Callable[[int, int, int], Schedule]
