"""Peak memory per pipeline rank: model state plus activations as the schedule holds them.

Activations are counted by walking the rank's action list: a forward adds the stage's
per-microbatch activations, a full backward frees them, an input-gradient backward frees
all but what its weight-gradient half still needs, which that ``W`` then frees. The peak
of that walk is the schedule's real in-flight memory (``p`` microbatches on the first
rank of 1F1B, all ``m`` for GPipe, more for interleaved schedules).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.schedules.actions import Schedule, flat, parts
from mpsim.workload.memory import model_state_bytes
from mpsim.workload.stages import Workload


@dataclass(frozen=True)
class RankMemory:
    """Memory of one pipeline rank (every TP/DP peer holds the same)."""

    rank: int
    stages: tuple[int, ...]
    params: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_peak_bytes: float
    peak_in_flight: int  # (stage, microbatch) forwards held at the peak
    capacity_bytes: float

    @property
    def model_state_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def peak_memory_bytes(self) -> float:
        return self.model_state_bytes + self.activations_peak_bytes

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.capacity_bytes

    @property
    def largest_category(self) -> str:
        """The category that takes the most memory (what to shrink first)."""
        parts = {"weights": self.weights_bytes, "gradients": self.grads_bytes,
                 "optimizer state": self.optimizer_bytes, "activations": self.activations_peak_bytes}
        return max(parts, key=parts.__getitem__)


def _activation_deltas(work, kind: str) -> tuple[float, int]:
    """(change in held activation bytes, change in forwards in flight) when an action ends."""
    if kind == "F":
        return work.activation_bytes, 1
    if kind == "B":
        return -work.activation_bytes, -1
    if kind == "I":
        return work.weight_grad_buffer_bytes - work.activation_bytes, -1
    return -work.weight_grad_buffer_bytes, 0  # W


def activation_timeline(timeline, workload: Workload, rank: int) -> list[tuple[float, float]]:
    """(time, activation bytes held) after every action of ``rank``, from the simulated timeline.

    Activations are counted as allocated from the start of a forward and released at the
    end of the backward that consumes them.
    """
    level = 0.0
    points = [(0.0, 0.0)]
    for record in timeline.actions[rank]:
        for action in parts(record.action):
            delta, _ = _activation_deltas(workload.stages[action.stage], action.kind)
            when = record.start_s if delta > 0 else record.end_s
            level += delta
            points.append((when, level))
    return points


def activation_walk(schedule: Schedule, rank: int, workload: Workload) -> tuple[float, int]:
    """(peak activation bytes, forwards in flight at the peak) over the rank's action list."""
    level = peak = 0.0
    in_flight = peak_count = 0
    for stage, kind, _ in flat(schedule.actions[rank]):
        delta, count = _activation_deltas(workload.stages[stage], kind)
        level += delta
        in_flight += count
        if level > peak:
            peak, peak_count = level, in_flight
    return peak, peak_count


def rank_memory(schedule: Schedule, workload: Workload, capacity_bytes: float, *, dp: int,
                grad_bytes: int, distributed_optimizer: bool) -> list[RankMemory]:
    """Memory of every pipeline rank."""
    result = []
    for rank in range(schedule.num_ranks):
        stages = tuple(s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank)
        params = sum(workload.stages[s].params for s in stages)
        state = model_state_bytes(params, grad_bytes=grad_bytes, dp=dp, distributed_optimizer=distributed_optimizer)
        peak, count = activation_walk(schedule, rank, workload)
        result.append(RankMemory(rank, stages, params, state.weights_bytes, state.grads_bytes,
                                 state.optimizer_bytes, peak, count, capacity_bytes))
    return result
