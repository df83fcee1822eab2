"""What FSDP's chunk window costs in time: the gathers of chunks coming back into it.

``torch.distributed.pipelining`` keeps at most a few of a rank's model chunks gathered
(``schedules/unshard.py``). Each time a chunk comes back into the window the runtime
issues its all-gathers (``UNSHARD``) before an item, at least one item before the chunk's
next pass, and that pass waits until they are done (``_assert_unsharded``). The host
issues them as soon as it has launched the item before, so on FSDP's all-gather stream
they run beside that item's compute: the engine takes the wait as
``EngineInput.gathered_after``, the chunk's next item starting no earlier than the
gathers' seconds after the item before the one they were issued at started. Gathers issued
at the same item run one after the other. The compute they run beside is not slowed by
them here, and a host further ahead of the GPU would issue them earlier still.
"""

from __future__ import annotations

from mpsim.cost.actions import CostModel
from mpsim.cost.collectives import collective_time
from mpsim.schedules.actions import Schedule, stages_by_rank
from mpsim.schedules.unshard import Gathering, rank_gathers
from mpsim.workload.stage_work import FSDP_PARAM_BYTES, StageWork, Workload, fsdp_copies


def chunk_gather_s(work: StageWork, model: CostModel) -> float:
    """Seconds to gather a model chunk's FSDP-sharded parameters whole: one all-gather per layer
    (FSDP's units), one after the other on its all-gather stream, then their copy out of the
    gather buffers, the op FSDP's passes price too (``stage_work.fsdp_copies``)."""
    layers = max(1, work.layers)
    seconds = layers * collective_time("all-gather", work.params / layers * FSDP_PARAM_BYTES,
                                       model.placements["zero"], model.system)
    if work.expert_params:
        seconds += layers * collective_time("all-gather", work.expert_params / layers * FSDP_PARAM_BYTES,
                                            model.placements["edp"], model.system)
    copy_out, _ = fsdp_copies(work.params + work.expert_params, model.scenario.training.grad_bytes)
    return seconds + model.compute.time(copy_out)


def window_gathers(schedule: Schedule, workload: Workload, model: CostModel, gathering: Gathering | None
                   ) -> dict[tuple[int, int], tuple[tuple[int, float], ...]]:
    """``EngineInput.gathered_after`` of a step: for each item that waits for a chunk gathered
    again by the window, (the item the gathers were issued at, their seconds); empty without a window."""
    if gathering is None or gathering.window is None:
        return {}
    waits: dict[tuple[int, int], tuple[tuple[int, float], ...]] = {}
    held = stages_by_rank(schedule.stage_to_rank, schedule.num_ranks)
    seconds_of: dict[int, float] = {}
    for rank, items in enumerate(schedule.actions):
        queued_at, queued_s = -1, 0.0
        for issued, stage, used in rank_gathers(items, held[rank], gathering).regathers:
            seconds = seconds_of.get(stage)
            if seconds is None:
                seconds = seconds_of[stage] = chunk_gather_s(workload.stages[stage], model.on_rank(rank))
            # gathers issued at one item queue on the all-gather stream
            queued_s = (queued_s if issued == queued_at else 0.0) + seconds
            queued_at = issued
            waits[(rank, used)] = waits.get((rank, used), ()) + ((issued, queued_s),)
    return waits
