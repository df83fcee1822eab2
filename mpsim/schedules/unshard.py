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
which ``simulate.overlapped_param_gather_s`` prices. The torch runtime also frees a chunk
that is not among the next three its rank will compute and gathers it again ahead of its
next pass (``_add_unshard_reshard``'s ``max_active_stages``); with more than three chunks
per rank those extra gathers are not marked.

Without ``reshard_after_forward`` no pass gathers (``Layout.fsdp_whole_step``), and the
schedule is left as it is.
"""

from __future__ import annotations

from dataclasses import replace

from mpsim.schedules.actions import Action, Item, Overlapped, Schedule, Unsharding, stages_by_rank


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


def _marked(action: Action, resident: set[int]) -> Action:
    """``action``, as ``Unsharding`` when it must gather; ``resident`` follows what it leaves gathered."""
    return Unsharding(*action) if gathers(action.stage, action.kind, resident) else action


def mark_unsharding(schedule: Schedule) -> Schedule:
    """``schedule`` with every action that gathers its stage's parameters as ``Unsharding``
    (FSDP resharding after the forward under a pipeline: module doc)."""
    ranks = []
    for items, held in zip(schedule.actions, stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)):
        resident = set(held)  # gathered at the start of the step
        marked: list[Item] = []
        for item in items:
            if isinstance(item, Overlapped):
                # torch runs the pair's forward, then its backward
                marked.append(Overlapped(_marked(item.forward, resident), _marked(item.backward, resident)))
            else:
                marked.append(_marked(item, resident))
        ranks.append(tuple(marked))
    return replace(schedule, actions=tuple(ranks))
