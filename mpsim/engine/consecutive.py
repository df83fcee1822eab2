"""Steps that overlap their neighbours: the period of a long run.

With the usual optimizer step, every rank waits for the step's global reductions (the
gradient norm for clipping, the NaN / inf check of fp16 loss scaling) before it updates
its weights, so no rank starts the next step before every rank has finished this one: a
run is one step after another, and the step time is one step's span.

Zero Bubble's optimizer post-validation (Qi et al. 2024, Section 5; ``--enable-optimizer-
post-validation`` in the authors' fork of Megatron-LM) takes that barrier out. In the fork
(``megatron/optimizer/optimizer.py``, ``pre_step``; ``megatron/core/pipeline_parallel/
zb_schedules.py``, ``run_until_post_validation``):

1. Each rank updates as soon as its gradients are final and it has received the partial
   norm and NaN flag of the ranks before it, which it passes on: the ranks' optimizer
   steps start in pipeline order, each no earlier than the one before it
   (``EngineInput.optimizer_chain``).
2. The next step starts on each rank right after its own update, so its first forwards
   run while later ranks are still in the last step's cool-down.
3. The fully reduced norm and flag travel back from the last rank to the first inside the
   next step's warm-up, where every rank checks them (and rolls its update back in the
   rare step that fails). The fork places that check on every rank at one planned time,
   the latest start of any rank's last warm-up forward (the last forward that ends before
   the rank's first backward ends); a rank goes on past it only once the last rank has
   passed its update, so after every rank finished the last step.

:func:`steady_period` runs step after step of one engine input: step ``k + 1`` is the same
input with each rank's first item held until that rank's step ``k`` ended (2), and the
item at the check held until the last rank's step ``k`` ended (3), in times relative to
the earliest start. When the ranks' starts relative to each other come back the same
(within ``RTOL``), every later step repeats, and the time from one step to the next is
the step time of a long run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from mpsim.engine.core import EngineInput, simulate
from mpsim.engine.timeline import ROUNDING, Timeline
from mpsim.schedules.actions import parts

RTOL = 1e-9  # relative: rank periods this close are one period
MAX_STEPS = 32  # steps run before the mean period over them is taken instead


@dataclass(frozen=True)
class Period:
    """The time from one step to the next in a long run, and how it was found."""

    period_s: float
    steps: int  # steps simulated, the first one included
    repeated: bool  # the ranks' relative starts came back the same; False: the mean over ``steps``


def check_items(timeline: Timeline) -> list[int | None]:
    """Per rank, the index of the item before which the check of the last step's update runs
    (3 in the module doc), from the first step's records; None where no item starts after it."""
    starts = []
    for records in timeline.actions:
        first_backward_end = next((r.end_s for r in records if parts(r.action)[0].kind in ("B", "I")), None)
        forwards = [r for r in records if parts(r.action)[0].kind == "F"
                    and (first_backward_end is None or r.end_s <= first_backward_end)]
        if forwards:
            starts.append(forwards[-1].start_s)
    if not starts:
        return [None] * timeline.num_ranks
    at = max(starts)
    return [next((r.index for r in records if r.start_s >= at), None) for records in timeline.actions]


def steady_period(inp: EngineInput, run: Callable[[EngineInput], Timeline] = simulate,
                  max_steps: int = MAX_STEPS, first: Timeline | None = None) -> Period:
    """The period of a long run of ``inp``'s step, each step following the last without a barrier.

    ``run`` evaluates the steps with held items (the SimPy engine; held items are its own
    feature). The run's first step is the step alone, every rank starting at 0: ``first``
    where the caller has its timeline with the records of its warm-up already, else ``run``'s.
    """
    first = first if first is not None else run(inp)
    checks = check_items(first)
    last_rank = len(first.rank_end_s) - 1
    ends = list(first.rank_end_s)  # each rank's end of the latest step, in absolute time
    first_end = max(ends)
    for steps in range(2, max_steps + 1):
        base = min(ends)
        relative = [end - base for end in ends]
        held = {(rank, 0): at for rank, at in enumerate(relative) if at > 0.0}
        for rank, index in enumerate(checks):
            if index is not None:
                at = max(held.get((rank, index), 0.0), relative[last_rank])
                if at > 0.0:
                    held[(rank, index)] = at
        timeline = run(replace(inp, not_before_s=held))
        following = [base + end for end in timeline.rank_end_s]
        periods = [after - before for before, after in zip(ends, following)]
        ends = following
        if max(periods) - min(periods) <= RTOL * max(periods):
            return Period(_no_longer(max(periods), first_end), steps, True)
    return Period(_no_longer((max(ends) - first_end) / (max_steps - 1), first_end), max_steps, False)


def _no_longer(period_s: float, alone_s: float) -> float:
    """``period_s``, or the step alone where the period exceeds it by rounding only: a step that
    starts no later on any rank than a barrier would let it ends no later (the engine's times
    are maxima and sums of the same durations), but the difference of two end times rounds."""
    return alone_s if alone_s < period_s <= alone_s * (1 + ROUNDING) else period_s
