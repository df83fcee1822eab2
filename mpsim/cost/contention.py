"""Compute beside collectives: the SMs a running collective holds are not the compute's.

An NCCL collective runs as kernels, one thread block per channel, each on an SM of its
own (``collective_channels`` in the system file: NCCL does not share an SM between its
blocks and compute). While it runs, compute that overlaps it has the other SMs only and
goes at ``1 - share`` of its speed, ``share`` being the collective's SMs over the device's.
mpsim applies that one rule to every collective that overlaps compute:

* tensor- and context-parallel collectives inside a pass (``actions.py``, ``Overlap``);
* ZeRO-3 / FSDP parameter gathers, prefetched beside the previous block, and their
  gradient reduce-scatters, beside the blocks after them (``actions.py``);
* the distributed optimizer's parameter all-gather overlapped with the next step's first
  forward (``step.py``, ``param_gather_exposed_s``);
* the communication a DualPipe F&B step hides under its other pass's compute (``pairs.py``),
  where DeepEP's MoE all-to-alls hold the SMs it runs on (``group_sm_share``).

Two collectives in flight at once (an FSDP gather on its stream beside a reduce-scatter on
another) hold their SMs each. What the rule leaves out is the memory bandwidth and L2 the
collective's copies take besides (published characterizations find more slowdown than the
SM share: docs/accuracy.md), and the final gradient reductions that the data-parallel stream
runs after the last backward, which the engine overlaps with compute without this cost.
"""

from __future__ import annotations

from collections.abc import Iterable

from mpsim.specs.parallel import TrainingOptions
from mpsim.specs.system import SystemSpec

# the slowest compute the rule lets several collectives in flight leave (a floor: with the
# shares of real systems, 12-27 % each, two at once leave half the SMs or more)
MIN_SPEED = 0.05


def group_sm_share(training: TrainingOptions, system: SystemSpec, group: str) -> float:
    """Share of the SMs a collective of ``group`` holds while compute runs beside it: NCCL's
    channels, or DeepEP's or HybridEP's own SMs (``training.moe_dispatch_sms``) for the MoE all-to-alls
    they run."""
    if group == "ep" and training.moe_token_dispatcher in ("deepep", "hybridep"):
        return min(1.0, training.moe_dispatch_sms / system.accelerator.compute_units)
    return system.collective_sm_share()


def side_by_side_s(compute_s: float, comm_s: float, sm_share: float) -> float:
    """Wall time of ``compute_s`` of compute that starts with a ``comm_s`` collective holding
    ``sm_share`` of the SMs: the compute goes at ``1 - sm_share`` of its speed until the
    collective ends, or the collective outlasts it."""
    if compute_s <= comm_s * (1.0 - sm_share):
        return comm_s
    return compute_s + comm_s * sm_share


def end_beside(start_s: float, compute_s: float, busy: Iterable[tuple[float, float]], sm_share: float) -> float:
    """When ``compute_s`` seconds of compute that start at ``start_s`` end, with collectives in
    flight over the ``busy`` intervals (start, end), each holding ``sm_share`` of the SMs."""
    if compute_s <= 0 or sm_share <= 0:
        return start_s + max(0.0, compute_s)
    # the compute's speed changes only where a collective starts or ends
    changes: list[tuple[float, int]] = []
    for begin, end in busy:
        if end > start_s and end > begin:
            changes.append((max(begin, start_s), 1))
            changes.append((end, -1))
    changes.sort()
    clock, left, running = start_s, compute_s, 0
    for at, step in changes:
        if at > clock:
            speed = max(MIN_SPEED, 1.0 - running * sm_share)
            if left <= (at - clock) * speed:
                return clock + left / speed
            left -= (at - clock) * speed
            clock = at
        running += step
    return clock + left
