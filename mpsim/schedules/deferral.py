"""The LM head's weight gradients deferred to the pipeline's drain, as a schedule transform.

Megatron-Core's ``defer_embedding_wgrad_compute`` (NeMo's recipes turn it on with
``wgrad_deferral_limit``): on the pipeline rank that holds the LM head, the output layer's
backward computes only its input gradient for the first ``limit`` microbatches (all of them
with limit 0) and buffers the logits' gradient and the layer's input
(``LinearWithGradAccumulationAndAsyncCommunication.backward``); after the rank's last
backward of the step, ``finish_embedding_wgrad_compute`` runs the buffered weight-gradient
GEMMs, where the other ranks are still draining the pipeline
(``megatron/core/pipeline_parallel/schedules.py``, ``megatron/core/utils.py``
``drain_embedding_wgrad_compute``).

As data this is the head stage's backward of those microbatches written as an ``I`` action
(everything but the head's weight gradient) and their ``W`` actions (the head's weight
gradient alone) appended after the rank's last action, in microbatch order. The workload
gives the head stage those two passes when the option is on (``stage_work``); the engine
runs any valid list, and the memory walk holds each deferred microbatch's buffer from its
``I`` to its ``W``.
"""

from __future__ import annotations

from mpsim.schedules.actions import Action, Overlapped, Schedule


def head_stage(schedule: Schedule) -> int:
    """The stage that holds the LM head: the last stage of the last chain."""
    return schedule.num_stages - 1


def defer_head_weight_grads(schedule: Schedule, limit: int) -> Schedule:
    """``schedule`` with the head stage's first ``limit`` backwards (0: all) split, their weight
    gradients run after the rank's last action.

    Raises ValueError when the head stage's backward is already split or paired (the
    deferral is Megatron's 1F1B and interleaved schedules' feature).
    """
    stage = head_stage(schedule)
    rank = schedule.stage_to_rank[stage]
    deferred: list[int] = []
    rewritten = []
    for item in schedule.actions[rank]:
        if isinstance(item, Overlapped) or (item.stage == stage and item.kind in ("I", "W")):
            raise ValueError(f"the LM head's stage {stage} runs {item}; its weight gradients can be deferred only "
                             f"where its backward runs whole (Megatron's 1F1B and interleaved schedules)")
        if item.stage == stage and item.kind == "B" and (limit == 0 or len(deferred) < limit):
            deferred.append(item.microbatch)
            rewritten.append(Action(stage, "I", item.microbatch))
        else:
            rewritten.append(item)
    rewritten += [Action(stage, "W", microbatch) for microbatch in deferred]
    actions = tuple(tuple(rewritten) if r == rank else schedule.actions[r] for r in range(schedule.num_ranks))
    return Schedule(schedule.name, schedule.num_microbatches, schedule.stage_to_rank, actions, schedule.chains)
