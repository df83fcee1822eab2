"""One pipeline rank's simulated step as a PyTorch memory snapshot.

The snapshot is the dictionary ``torch.cuda.memory._snapshot()`` returns (``segments``
with their blocks, and ``device_traces``: the allocator's history of ``alloc``,
``free_requested`` / ``free_completed``, ``segment_alloc`` / ``segment_free`` and ``oom``
events), pickled as ``torch.cuda.memory._dump_snapshot`` writes it. It opens in
pytorch.org/memory_viz and in ``python -m torch.cuda._memory_viz`` (``stats``, ``trace``,
``segments``) like a recording of a real step. mpsim's memory goes through a model of the
caching allocator (``caching_allocator``), so the segments are what such an allocator
would hold: no larger than the device, cached after their blocks are freed.

What is in it:

- Allocated before the recording starts, so active blocks in the final state with no
  trace event (how PyTorch's viewer tells memory that predates a recording): the model
  state (weights, gradients, optimizer state, each one allocation like a framework's flat
  buffers), the communication buffers, and the memory mpsim reserves outside tensors
  (CUDA context, cuBLAS workspace, NCCL buffers). Of those three a real snapshot holds
  only the cuBLAS workspace; all are here so the snapshot adds up to mpsim's memory table.
- Recorded during the step, timed from the engine's timeline: each (stage, microbatch)
  forward allocates its activations when it starts; the backward that consumes them frees
  them when it ends. An input-gradient pass (``I``) of a split backward frees them and
  allocates what its weight-gradient pass (``W``) still needs, which that ``W`` frees.
  Parameters that ZeRO-3 gathers come and go where ``memory.param_steps`` says: with
  FSDP holding them from forward to backward, a stage's are allocated with its first
  open forward and freed after the backward that closes the last; with FSDP resharding
  after the forward under a pipeline, each chunk of the rank is gathered when the
  recording starts, a forward frees it, a backward that finds it freed gathers it and
  keeps it, and the chunk's last pass frees it when it ends; where the pipeline runtime's
  chunk window binds (``parallel.fsdp_gathered_chunks``), a chunk is gathered and freed as
  one block when the runtime comes to the action it gathers or frees it before, and what
  it still holds after the last action is freed then. FSDP frees and gathers
  layer by layer as a pass goes; the snapshot moves a chunk's parameters as one block,
  freed before the pass allocates and gathered after it frees, which reaches the
  layer-by-layer peak to within a layer and is the order the memory table's walk counts.
  Every ``alloc`` event has its free events, so the step ends with only the resident blocks
  allocated, and the peak of the recorded allocations on top of them is mpsim's
  ``peak_memory_bytes`` less its fragmentation allowance.
- Fragmentation: mpsim's table adds ``training.memory_fragmentation`` x allocated as an
  allowance; the snapshot shows instead the free space the allocator model leaves in its
  segments (``total_free`` in ``stats``, inactive blocks in the viewer).
- An allocation larger than the device (only out-of-memory scenarios have one) is cut
  into parts no larger than the device.

Out of memory: the snapshot still holds the whole step, as if the device were large
enough, so the viewer shows everything the step needs; one ``oom`` event marks the request
that a device of this capacity would have failed (the first; at the start of the trace
when the resident state alone does not fit), where a real run would have stopped.
"""

from __future__ import annotations

import pickle

from mpsim.results.caching_allocator import LARGE_SEGMENT_ROUND_BYTES, CachingAllocator
from mpsim.results.memory import RankMemory, held_params, param_steps
from mpsim.schedules.actions import parts
from mpsim.simulate import SimulationResult
from mpsim.workload.memory import gathered_params_bytes


def _frames(label: str) -> list[dict]:
    """The stack an allocation is shown with: one frame that names what it holds."""
    return [{"filename": "mpsim", "line": 0, "name": label}]


def resident_allocations(memory: RankMemory) -> list[tuple[str, float]]:
    """(name, bytes) of what the rank holds for the whole step, in allocation order."""
    reserved = [(f"reserved: {name}", size) for name, size in memory.reserved_parts] \
        or [("reserved", memory.reserved_bytes)]
    # the held ZeRO-3 parameters come and go with the forwards; the trace records them
    return [("weights", memory.weights_bytes), ("gradients", memory.grads_bytes),
            ("optimizer state", memory.optimizer_bytes),
            ("communication buffers", memory.buffers_bytes - memory.gathered_params_bytes), *reserved]


def memory_snapshot(result: SimulationResult, memory: list[RankMemory], rank: int) -> dict:
    """The PyTorch memory snapshot of pipeline rank ``rank`` over the simulated step."""
    m = memory[rank]
    allocator = CachingAllocator(int(m.capacity_bytes))
    # the largest piece whose segment (rounded up to 2 MiB) still fits on the device
    largest_piece = max(LARGE_SEGMENT_ROUND_BYTES,
                        int(m.capacity_bytes) // LARGE_SEGMENT_ROUND_BYTES * LARGE_SEGMENT_ROUND_BYTES)

    def allocate(size_bytes: float, label: str) -> list[int]:
        total = round(size_bytes)
        count = -(-total // largest_piece)
        addresses = []
        for index in range(count):
            piece = total // count + (1 if index < total % count else 0)
            addresses.append(allocator.malloc(piece, _frames(label if count == 1
                                                             else f"{label} (part {index + 1} of {count})")))
        return addresses

    def release(addresses: list[int]) -> None:
        for address in addresses:
            allocator.free(address)

    for name, size in resident_allocations(m):
        allocate(size, name)

    allocator.recording = True
    allocator.time_us = 0
    stages = result.workload.stages
    layout = result.layout
    steps = param_steps(result.schedule, rank, result.workload, held_params(layout), layout.fsdp_gathering)
    why = "ZeRO-3, held from forward to backward" if held_params(layout) else "FSDP, freed by a forward"
    gathered: dict[int, list[int]] = {}  # stage -> addresses of its gathered parameters
    for stage in steps.resident:
        gathered[stage] = allocate(gathered_params_bytes(stages[stage]),
                                   f"gathered parameters of stage {stage} ({why}; at the start of the step)")
    live: dict[tuple, list[int]] = {}  # (what, stage, microbatch) -> addresses of its parts
    index = 0
    for record in result.timeline.actions[rank]:
        for action in parts(record.action):
            stage, kind, microbatch = action.stage, action.kind, action.microbatch
            work = stages[stage]
            where = f"stage {stage}, microbatch {microbatch}"
            change = steps.changes[index]
            if steps.before and steps.before[index]:
                # the runtime's chunk window frees chunks, then gathers others, as it comes to the action
                allocator.time_us = round(record.start_s * 1e6)
                for other, size in steps.before[index]:
                    if size < 0:
                        release(gathered.pop(other))
                    else:
                        gathered[other] = allocate(size, f"gathered parameters of stage {other} (the pipeline "
                                                         f"runtime's chunk window; before {action})")
            # allocations when a forward starts, frees when a backward ends (memory.memory_timeline);
            # parameters a pass frees go before what it allocates, parameters it gathers after what it frees
            allocator.time_us = round((record.start_s if kind == "F" else record.end_s) * 1e6)
            if change < 0:
                release(gathered.pop(stage))
            if kind == "F":
                live[("activations", stage, microbatch)] = allocate(
                    work.activation_bytes, f"activations of {where} (forward until backward)")
            elif kind in ("B", "I"):
                release(live.pop(("activations", stage, microbatch), []))
                if kind == "I":
                    live[("weight grad", stage, microbatch)] = allocate(
                        work.weight_grad_buffer_bytes,
                        f"inputs and output gradients of {where} kept for its weight gradient (I until W)")
            else:  # W
                release(live.pop(("weight grad", stage, microbatch), []))
            if change > 0:
                gathered[stage] = allocate(change, f"gathered parameters of stage {stage} ({why}; by {where})")
            if steps.freed_after[index] and stage in gathered:
                release(gathered.pop(stage))  # the chunk's last pass: its gradients reduced, its parameters freed
            index += 1
    for addresses in gathered.values():  # what a chunk window leaves gathered is freed after the last action
        release(addresses)
    return {"segments": allocator.snapshot_segments(), "device_traces": [allocator.trace]}


def write_memory_snapshot(result: SimulationResult, memory: list[RankMemory], rank: int, path: str) -> None:
    """Write ``memory_snapshot`` as a pickle (what ``torch.cuda.memory._dump_snapshot`` writes)."""
    with open(path, "wb") as handle:
        pickle.dump(memory_snapshot(result, memory, rank), handle)
