"""A paired forward and backward (DualPipe's F&B step, Megatron-Core's combined 1F1B) priced as one action.

DualPipe and DualPipeV pair a forward of one stage with a backward of another and run
them as one step (``Overlapped`` in the schedule). Whether the two overlap is the
framework's: DeepSeek's implementation interleaves their compute and communication,
PyTorch's schedule runtime runs one half after the other (``training.overlap_paired_passes``).
Megatron-Core's combined 1F1B (``training.overlap_moe_expert_parallel_comm``) pairs the
steady state's passes of its interleaved schedule and always overlaps them, but only
their expert all-to-alls, which it runs on a stream of their own; the tensor- and
context-parallel collectives stay in line with the compute that needs them.
"""

from __future__ import annotations

from collections.abc import Callable

from mpsim.cost.actions import ActionCost
from mpsim.cost.contention import side_by_side_s
from mpsim.cost.segments import Segment

# the collectives Megatron-Core's combined 1F1B runs on its communication stream: the MoE token
# dispatcher's, its all-to-alls over the expert-parallel group and, with expert tensor parallelism,
# the gathers and reduce-scatters over that group that belong to the same dispatch and combine
# (megatron/core/models/common/model_chunk_schedule_plan.py builds each layer's moe_dispatch and
# moe_combine nodes on the communication stream, the attention and the experts on the compute stream)
EXPERT_DISPATCH_GROUPS = frozenset({"ep", "etp"})


def overlapped_cost(forward: ActionCost, backward: ActionCost, overlap: bool = True,
                    sm_share: Callable[[str], float] | None = None,
                    hides: frozenset[str] | None = None) -> ActionCost:
    """A forward and a backward run as one step of a DualPipe schedule (its F&B).

    With ``overlap`` (DeepSeek's implementation, ``training.overlap_paired_passes``) their
    compute shares the device and adds up, and each one's exposed communication can hide
    under the other's compute, which meanwhile runs on the SMs the communication's kernels
    leave it (``sm_share``: the share a group's kernels hold; the one rule of
    ``contention.py``), so what exceeds the pair's compute shows, and the compute slows
    by what it hides. Without it (PyTorch's schedule runtime runs the two halves of an
    OVERLAP_F_B one after the other) the pair lasts a forward plus a backward, each with
    its own exposed communication. ``hides``: the groups whose exposed collectives can hide
    (None: every group's); the others' stay exposed, added to the pair's time.
    """
    compute = forward.compute_s + backward.compute_s
    shift = forward.duration_s
    segments = forward.segments + tuple(
        Segment(seg.stream, seg.category, seg.label, seg.offset_s + shift, seg.duration_s) for seg in backward.segments)
    # the pair's segments are laid end to end; the span is the overlapped duration
    dp_wait = forward.dp_exposed_s + backward.dp_exposed_s
    groups: dict[str, float] = {}
    for group, seconds in forward.exposed_by_group + backward.exposed_by_group:
        groups[group] = groups.get(group, 0.0) + seconds
    host_wait = forward.host_wait_s + backward.host_wait_s
    if not overlap:
        return ActionCost(forward.duration_s + backward.duration_s, compute, forward.tp_comm_s + backward.tp_comm_s,
                          forward.tp_exposed_s + backward.tp_exposed_s, forward.flops + backward.flops, segments,
                          dp_wait, _end_to_end(forward, backward), tuple(sorted(groups.items())), host_wait)
    hidden = forward.tp_exposed_s + backward.tp_exposed_s
    kept = {group: seconds for group, seconds in groups.items() if hides is not None and group not in hides}
    hideable = {group: seconds for group, seconds in groups.items() if group not in kept}
    hidden -= sum(kept.values())
    total = sum(hideable.values())
    # the communication's SMs, weighted by each group's share of it
    held = sum(seconds * sm_share(group) for group, seconds in hideable.items()) / total \
        if sm_share is not None and total > 0 else 0.0
    exposed = side_by_side_s(compute, hidden, held) - compute if hidden > 0 else 0.0
    # what stays exposed is shared out over the groups in proportion to their own exposure
    share = exposed / total if total > 0 else 0.0
    exposed_by_group = {group: seconds * share for group, seconds in hideable.items()} | kept
    exposed += sum(kept.values())
    return ActionCost(compute + exposed + dp_wait + host_wait, compute, forward.tp_comm_s + backward.tp_comm_s,
                      exposed, forward.flops + backward.flops, segments, dp_wait,
                      forward.async_dp + backward.async_dp, tuple(sorted(exposed_by_group.items())), host_wait)


def _end_to_end(forward: ActionCost, backward: ActionCost) -> tuple[tuple[float, float, str], ...]:
    """The two halves' DP-stream reductions, their ready points placed on the pair laid end to end."""
    total = forward.duration_s + backward.duration_s
    if total <= 0:
        return forward.async_dp + backward.async_dp
    first = forward.duration_s / total
    return (tuple((ready * first, seconds, label) for ready, seconds, label in forward.async_dp)
            + tuple((first + ready * (1 - first), seconds, label) for ready, seconds, label in backward.async_dp))
