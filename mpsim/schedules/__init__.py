"""Pipeline schedules as data: generators, the text form, validation.

``build_schedule`` is the one entry point: a name (or ``file:PATH``) and the layout's
(pp, vpp, microbatches) in, a validated :class:`Schedule` out.
"""

from __future__ import annotations

from pathlib import Path

from mpsim.errors import did_you_mean
from mpsim.schedules.actions import (Action, Item, Overlapped, Schedule, ScheduleTextError, flat,
                                    load_schedule_file, parts, schedule_from_text)
from mpsim.schedules.generators import loop_placement
from mpsim.schedules.registry import SCHEDULES, canonical_name, chunks_per_rank, generate
from mpsim.schedules.validate import ScheduleError, validate
from mpsim.schedules.zb_search import SEARCHED, Timer



def schedule_names() -> list[str]:
    """Names ``parallel.schedule`` accepts (besides ``file:PATH``)."""
    return list(SCHEDULES)


def unknown_schedule(name: str, files: bool = False) -> str | None:
    """The message for a name no schedule is registered under (None for a known one), with the
    closest names as a hint; ``files``: ``file:PATH`` is accepted where the name is asked."""
    key = canonical_name(name)
    if key in SCHEDULES:
        return None
    known = f"known: {', '.join(schedule_names())}" + (", or file:PATH" if files else "")
    return f"unknown schedule {name!r}; {did_you_mean(key, schedule_names()) or known}"


# Stage-microbatch pairs a schedule may hold: a few million actions, a minute or so of
# simulation; real steps have at most tens of thousands (1,024 microbatches on 64 stages).
MAX_STAGE_PASSES = 1_000_000


def build_schedule(name: str, pp: int, vpp: int, num_microbatches: int, base_dir: Path | None = None,
                   check: bool = False, timer: Timer | None = None,
                   microbatch_group_size: int | None = None, combined: bool = False) -> Schedule:
    """A valid schedule; raises ScheduleError with a one-line reason.

    Schedules read from a file are always validated; generated ones only with ``check``.
    Searched schedules (zb-1p, zb-2p) need ``timer``, the engine's timing of a fixed
    schedule (``mpsim.engine.rank_spans``): schedules are data and do not run the engine.
    ``microbatch_group_size``: Megatron-Core's contiguous microbatches per chunk, for its
    interleaved schedule (None: the generator's default). ``combined``: its combined 1F1B, the
    steady state's forward and backward paired (``training.overlap_moe_expert_parallel_comm``).
    """
    _check_size(pp, vpp, num_microbatches)
    if name.startswith("file:") and microbatch_group_size is not None:
        raise ScheduleError("microbatch_group_size orders a generated interleaved schedule; a schedule file "
                            "gives its own order (leave it unset)")
    if name.startswith("file:") and combined:
        raise ScheduleError("overlap_moe_expert_parallel_comm pairs the passes of Megatron-Core's generated "
                            "schedule; a schedule file gives its own pairs ((F;B)OVERLAP_F_B items)")
    if name.startswith("file:"):
        path = Path(name[5:])
        if base_dir is not None and not path.is_absolute() and (base_dir / path).is_file():
            path = base_dir / path
        if not path.is_file():
            raise ScheduleError(f"schedule file {name[5:]!r} not found")
        try:
            schedule = load_schedule_file(path)
        except ScheduleTextError as exc:
            raise ScheduleError(f"{path.name}: {exc}") from None
        expected = (pp, pp * vpp, num_microbatches)
        actual = (schedule.num_ranks, schedule.num_stages, schedule.num_microbatches)
        if actual != expected:
            raise ScheduleError(f"{path.name} has {actual[0]} ranks, {actual[1]} stages, {actual[2]} microbatches; "
                                f"the plan has pp={pp}, pp x vpp={pp * vpp} stages, {num_microbatches} microbatches")
    else:
        key = canonical_name(name)
        problem = unknown_schedule(name, files=True)
        if problem:
            raise ScheduleError(problem)
        try:
            schedule = generate(key, pp, vpp, num_microbatches, timer, microbatch_group_size, combined)
        except ValueError as exc:
            raise ScheduleError(str(exc)) from None
        if not check:
            return schedule  # generators are checked over a grid by the test suite
    validate(schedule)
    return schedule


def _check_size(pp: int, vpp: int, num_microbatches: int) -> None:
    passes = pp * vpp * num_microbatches
    if passes > MAX_STAGE_PASSES:
        raise ScheduleError(f"{pp} ranks x {vpp} chunks x {num_microbatches:,} microbatches is {passes:,} stage "
                            f"passes, more than the {MAX_STAGE_PASSES:,} mpsim simulates; use fewer microbatches "
                            f"(a larger parallel.microbatch_size, or a smaller parallel.global_batch_size per "
                            f"replica)")


def is_searched(name: str) -> bool:
    """Whether ``name`` is a schedule found by a search over the priced stage times (zb-1p, zb-2p)."""
    return not name.startswith("file:") and canonical_name(name) in SEARCHED


def search_outline(name: str, pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """The frame of a searched schedule: its stages on their ranks and no actions yet.

    ``build_schedule`` returns a searched schedule searched with unit times, an order to
    print or to hold memory against; a caller that searches again with the priced stage
    times (``simulate``) needs only the frame, checked as ``build_schedule`` checks the
    layout, and skips the unit-time search it would throw away.
    """
    key = canonical_name(name)
    if key not in SEARCHED:
        raise ValueError(f"{name!r} is not a searched schedule")
    _check_size(pp, vpp, num_microbatches)
    problem = SCHEDULES[key].check_vpp(key, vpp)
    if problem:
        raise ScheduleError(problem)
    return Schedule(key, num_microbatches, loop_placement(pp, 1), tuple(() for _ in range(pp)))


__all__ = ["Action", "Item", "Overlapped", "SCHEDULES", "Schedule", "ScheduleError", "build_schedule",
           "canonical_name", "chunks_per_rank", "flat", "is_searched", "parts", "schedule_from_text", "schedule_names",
           "search_outline", "unknown_schedule", "validate"]
