"""Run PyTorch's pipeline schedules on the validation model and record every action.

Each rank builds the model chunks mpsim's schedule puts on it (``stage_to_rank``: loop
placement for interleaved schedules, a V for ZB-V and DualPipeV), wraps them in
``PipelineStage`` and runs the matching ``torch.distributed.pipelining`` schedule class.

Recording does not touch PyTorch's code: the stage's ``forward_one_chunk``,
``backward_one_chunk`` and ``backward_weight_one_chunk`` are wrapped on the stage
objects, the loss (which PyTorch computes after the last stage's forward) is wrapped on
the schedule object and counted into that forward, as mpsim counts the cross entropy
into the last stage's ``F``, and the module-level ``_wait_batch_p2p`` is wrapped while a
step runs, so the time a rank spends blocked on its receives is known and the rest of
the gap between two actions is framework overhead (Python, posting sends and receives).

Gradients are never zeroed: after the first step every backward accumulates into the
existing ``.grad`` the way Megatron accumulates into its fp32 ``main_grad``. The step
runs no optimizer and ``scale_grads`` is off, so a step is the pipeline and nothing else.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from mpsim.calibrate.measure.machine import cpu_sample, process_cpu_s
from mpsim.calibrate.measure.torch_model import ModelShape, batch, build_chunk, lm_loss

# mpsim schedule name -> torch class name; a class missing from an older torch is skipped
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
SINGLE_STAGE = {"gpipe", "1f1b"}  # classes that take one stage, not a list


def torch_schedule_class(name: str):
    """The torch class for an mpsim schedule name, or None where this torch lacks it."""
    return getattr(torch_schedules, TORCH_SCHEDULES.get(name, ""), None)


@dataclass
class PipelineJob:
    """One schedule to run: the model, where its stages live, how many steps."""

    schedule: str
    shape: ModelShape
    layers_per_chunk: list[int]
    stage_to_rank: list[int]
    microbatches: int
    microbatch_size: int
    seed: int


class Recorder:
    """Collects (stage, kind, microbatch, start mark, end mark) and wait intervals on one rank."""

    def __init__(self, clock):
        self.clock = clock
        self.actions: list[list] = []
        self.waits: list[list] = []

    def reset(self) -> None:
        self.actions, self.waits = [], []

    def wrap_stage(self, stage: PipelineStage) -> None:
        """Record the stage's compute calls as F, B, I and W actions."""
        index = stage.stage_index
        forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        @functools.wraps(forward)
        def forward_one_chunk(chunk_id, *args, **kwargs):
            begin = self.clock.mark()
            out = forward(chunk_id, *args, **kwargs)
            self.actions.append([index, "F", chunk_id, begin, self.clock.mark()])
            return out

        @functools.wraps(backward)
        def backward_one_chunk(chunk_id, *args, **kwargs):
            kind = "B" if kwargs.get("full_backward", True) else "I"
            begin = self.clock.mark()
            out = backward(chunk_id, *args, **kwargs)
            self.actions.append([index, kind, chunk_id, begin, self.clock.mark()])
            return out

        @functools.wraps(weight)
        def backward_weight_one_chunk(chunk_id, *args, **kwargs):
            begin = self.clock.mark()
            out = weight(chunk_id, *args, **kwargs)
            self.actions.append([index, "W", chunk_id, begin, self.clock.mark()])
            return out

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def wrap_loss(self, schedule) -> None:
        """Record the loss as kind L of the last stage; merged into its forward later."""
        original = schedule._maybe_compute_loss

        def maybe_compute_loss(stage, output, target_mbs, mb_index, *args, **kwargs):
            if not stage.is_last:
                return original(stage, output, target_mbs, mb_index, *args, **kwargs)
            begin = self.clock.mark()
            result = original(stage, output, target_mbs, mb_index, *args, **kwargs)
            self.actions.append([stage.stage_index, "L", mb_index, begin, self.clock.mark()])
            return result

        schedule._maybe_compute_loss = maybe_compute_loss

    def wait_wrapper(self, original):
        """A stand-in for torch's ``_wait_batch_p2p`` that records how long it blocked."""

        def wait_batch_p2p(work):
            if not work:
                return original(work)
            begin = self.clock.mark()
            result = original(work)
            self.waits.append([begin, self.clock.mark()])
            return result

        return wait_batch_p2p

    def resolved(self) -> tuple[list[list], list[list]]:
        """Actions and waits with marks turned into seconds."""
        marks = [m for a in self.actions for m in a[3:]] + [m for w in self.waits for m in w]
        seconds = iter(self.clock.resolve(marks))
        actions = [[a[0], a[1], a[2], next(seconds), next(seconds)] for a in self.actions]
        waits = [[next(seconds), next(seconds)] for _ in self.waits]
        return actions, waits


def cpu_record(before, after, own_cpu_s: float) -> dict | None:
    """Machine busy time and this rank's own CPU time over one step (the parent finds the foreign share)."""
    if before is None or after is None:
        return None
    return {"busy_s": after.busy_s - before.busy_s, "total_s": after.total_s - before.total_s, "own_s": own_cpu_s}


class PipelineRunner:
    """The stages and schedule of one job on this rank, built once; :meth:`step` runs one step."""

    def __init__(self, job: PipelineJob, rank: int, device: torch.device, clock):
        self.job, self.clock = job, clock
        num_stages = len(job.stage_to_rank)
        mine = [s for s, r in enumerate(job.stage_to_rank) if r == rank]
        chunks = [build_chunk(job.shape, job.layers_per_chunk, s, job.seed, device) for s in mine]
        stages = [PipelineStage(chunk, s, num_stages, device) for chunk, s in zip(chunks, mine)]
        self.recorder = Recorder(clock)
        for stage in stages:
            self.recorder.wrap_stage(stage)
        cls = torch_schedule_class(job.schedule)
        if cls is None:
            raise ValueError(f"this torch has no schedule class for {job.schedule}")
        target = stages[0] if job.schedule in SINGLE_STAGE else stages
        self.schedule = cls(target, n_microbatches=job.microbatches, loss_fn=lm_loss, scale_grads=False)
        self.recorder.wrap_loss(self.schedule)
        ids, targets = batch(job.shape, job.microbatches * job.microbatch_size, job.seed, device)
        self.args = (ids,) if 0 in mine else ()
        self.kwargs = {"target": targets} if num_stages - 1 in mine else {}

    def step(self) -> dict:
        """Run one step after a barrier: its span, actions, waits and CPU use on this rank."""
        clock, recorder = self.clock, self.recorder
        original_wait = torch_schedules._wait_batch_p2p
        dist.barrier()
        clock.sync()
        recorder.reset()
        try:
            torch_schedules._wait_batch_p2p = recorder.wait_wrapper(original_wait)
            machine_before, own_before = cpu_sample(), process_cpu_s()
            begin = clock.mark()
            self.schedule.step(*self.args, return_outputs=False, **self.kwargs)
            end = clock.mark()
            machine_after, own_after = cpu_sample(), process_cpu_s()
        finally:
            torch_schedules._wait_batch_p2p = original_wait
        begin_s, end_s = clock.resolve([begin, end])
        actions, waits = recorder.resolved()
        return {"start_s": begin_s, "end_s": end_s, "actions": actions, "waits": waits,
                "cpu": cpu_record(machine_before, machine_after, own_after - own_before)}
