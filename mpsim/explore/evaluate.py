"""Evaluating one point: scenario in, one flat record of metrics (or of what went wrong) out.

A record's ``status`` is one of

* ``ok``: simulated; ``metrics`` holds the numbers (``out_of_memory`` is one of them);
* ``invalid``: a combination a framework would refuse (an :class:`InputError` from the
  loader, the layout rules or the schedule); skipped and counted, never fatal;
* ``oom``: the planner's memory pre-check found it does not fit, so it was not simulated;
* ``error``: anything else went wrong; the message is kept and the sweep goes on.

Evaluators are small picklable objects: the local process pool and Ray ship the same
object to their workers, which call ``evaluate(point)`` for each point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mpsim.engine import EngineInput, Timeline, rank_spans, simulate as engine_simulate
from mpsim.engine.excise import simulate_excised
from mpsim.engine.uncontended import simulate_uncontended
from mpsim.errors import InputError
from mpsim.explore.axes import Point, override_text
from mpsim.resolve import resolve
from mpsim.schedules import Schedule, ScheduleError, build_schedule, is_searched
from mpsim.schedules.deferral import defer_head_weight_grads
from mpsim.simulate import SimulationResult, plan_schedule, simulate
from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario

ENGINES = ("fast", "simpy")


@lru_cache(maxsize=128)
def generated_schedule(name: str, pp: int, vpp: int, num_microbatches: int, group: int | None = None,
                       combined: bool = False) -> Schedule:
    """A generated schedule, cached: layouts that differ only in recompute or SP share it
    (``group``: parallel.microbatch_group_size; ``combined``: Megatron-Core's combined 1F1B)."""
    return build_schedule(name, pp, vpp, num_microbatches, timer=rank_spans, microbatch_group_size=group,
                          combined=combined)


@lru_cache(maxsize=128)
def deferred_schedule(name: str, pp: int, vpp: int, num_microbatches: int, group: int | None, combined: bool,
                      limit: int) -> Schedule:
    """A generated schedule with the LM head's weight gradients deferred (``training.defer_embedding_wgrad``), cached."""
    return defer_head_weight_grads(generated_schedule(name, pp, vpp, num_microbatches, group, combined), limit)


def schedule_for(scenario: Scenario, layout: Layout, base_dir: Path | None, cached: bool = True) -> Schedule:
    """The layout's schedule as it runs (with the LM head's weight gradients deferred where the
    scenario says so); generated ones come from the cache (unless ``cached`` is False: a caller
    that keeps only a short form need not keep the full lists alive), files are read each time."""
    name, training = scenario.parallel.schedule, scenario.training
    if name.startswith("file:"):
        return plan_schedule(scenario, layout, base_dir)
    make, args = generated_schedule, (name, layout.pp, layout.vpp, layout.num_microbatches,
                                      layout.microbatch_group_size, layout.combined_1f1b)
    if training.defer_embedding_wgrad:
        make, args = deferred_schedule, (*args, training.wgrad_deferral_limit)
    try:
        return (make if cached else make.__wrapped__)(*args)
    except ScheduleError as exc:
        raise InputError(str(exc), field="parallel.schedule") from None
    except ValueError as exc:  # the deferral's refusal of a head stage whose backward is split
        raise InputError(str(exc), field="training.defer_embedding_wgrad") from None


def simulate_scenario(scenario: Scenario, base_dir: Path | None = None, engine: str = "fast",
                      layout: Layout | None = None, schedule: Schedule | None = None) -> SimulationResult:
    """``mpsim.simulate.simulate`` with a choice of engine (and reuse of a layout/schedule already built).

    ``fast`` evaluates the longest path (``mpsim/engine/longest_path.py``), also where shared links
    never carry two flows at once (``mpsim/engine/uncontended.py``), and falls back to the SimPy
    engine with the step's repeated middle cut out (``mpsim/engine/excise.py``) for an input it
    does not model; ``simpy`` always runs the engine over every action.
    """
    layout = layout or resolve(scenario)

    def run(inp: EngineInput) -> Timeline:
        return simulate_uncontended(inp, simulate_excised) if engine == "fast" else engine_simulate(inp)

    if schedule is None and not is_searched(scenario.parallel.schedule):
        schedule = schedule_for(scenario, layout, base_dir)  # a searched one simulate searches itself
    return simulate(scenario, base_dir, engine=run, layout=layout, schedule=schedule)


def summary_metrics(summary: Any) -> dict[str, Any]:
    """The numbers a sweep keeps from a ``results.Summary``, with the step-time breakdown.

    The breakdown is per mean pipeline rank: ``compute_s`` (actions minus their exposed
    TP collectives), ``exposed_tp_comm_s``, ``exposed_pp_comm_s`` (waiting on transfers
    and own sends), ``bubble_s`` (the rest of the idle time: warm-up, cool-down,
    dependencies), ``exposed_dp_comm_s`` (gradient reduction after the last backward and
    the tied-embedding sync) and ``optimizer_s``.
    """
    ranks = summary.ranks
    n = max(1, len(ranks))
    compute = sum(r.compute_s - r.tp_comm_exposed_s for r in ranks) / n
    return {
        "scenario": summary.scenario,
        "system": summary.system,
        "accelerator": summary.accelerator,
        "devices": summary.devices,
        "tp": summary.tp, "pp": summary.pp, "dp": summary.dp, "vpp": summary.vpp,
        "microbatch_size": summary.microbatch_size,
        "num_microbatches": summary.num_microbatches,
        "global_batch_size": summary.global_batch_size,
        "schedule": summary.schedule,
        "step_time_s": summary.step_time_s,
        "tokens_per_s": summary.tokens_per_s,
        "tokens_per_s_per_device": summary.tokens_per_s_per_device,
        "throughput_unit": summary.throughput_unit,
        "throughput_per_s": summary.throughput_per_s,
        "model_tflops_per_device": summary.model_tflops_per_device,
        "mfu": summary.mfu,
        "hfu": summary.hfu,
        "bubble_fraction": summary.bubble_fraction,
        "compute_s": compute,
        "exposed_tp_comm_s": summary.exposed_tp_comm_s,
        "exposed_pp_comm_s": summary.exposed_pp_comm_s,
        # a step that overlaps its neighbours (training.optimizer_post_validation) hides part of its
        # idle time under them: that part is cross_step_overlap_s, not bubble
        "bubble_s": max(0.0, summary.bubble_s - summary.exposed_pp_comm_s - summary.cross_step_overlap_s),
        "cross_step_overlap_s": summary.cross_step_overlap_s,
        "exposed_dp_comm_s": summary.exposed_dp_comm_s,
        "optimizer_s": summary.optimizer_s,
        "peak_memory_bytes": summary.peak_memory_bytes,
        "capacity_bytes": summary.capacity_bytes,
        "out_of_memory": summary.out_of_memory,
    }


# the numbers of summary_metrics a heatmap can colour its cells by
NUMERIC_METRICS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "throughput_per_s",
                   "model_tflops_per_device", "mfu", "hfu", "bubble_fraction", "compute_s", "exposed_tp_comm_s",
                   "exposed_pp_comm_s", "bubble_s", "exposed_dp_comm_s", "optimizer_s", "peak_memory_bytes")

BREAKDOWN = (("compute_s", "compute"), ("exposed_tp_comm_s", "TP comm"), ("exposed_pp_comm_s", "PP comm"),
             ("bubble_s", "bubble"), ("exposed_dp_comm_s", "DP comm"), ("optimizer_s", "optimizer"))


def failure(status: str, message: str, **metrics: Any) -> dict[str, Any]:
    """A record body for a point that was not simulated."""
    return {"status": status, "error": message, "metrics": metrics}


def error_text(exc: BaseException) -> str:
    """One line naming the exception type and its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class SweepEvaluator:
    """Evaluates points of a scenario file: load it with the base and point overrides, then simulate."""

    scenario_path: str
    base_overrides: tuple[str, ...] = ()
    engine: str = "fast"
    identity: dict = field(default_factory=dict)  # what the results-file key hashes besides the point

    def evaluate(self, point: Point) -> dict[str, Any]:
        from mpsim.explore.sweepfile import load_point
        from mpsim.results import summarize

        overrides = list(self.base_overrides) + [override_text(name, value) for name, value in point]
        try:
            loaded = load_point(self.scenario_path, overrides)
        except InputError as exc:
            return failure("invalid", str(exc))
        try:
            base_dir = loaded.path.parent if loaded.path else None
            result = simulate_scenario(loaded.scenario, base_dir, self.engine)
            metrics = summary_metrics(summarize(result))
        except InputError as exc:
            return failure("invalid", str(loaded.origins.locate(exc)))
        except Exception as exc:  # noqa: BLE001 - a broken point is recorded, the sweep goes on
            return failure("error", error_text(exc))
        return {"status": "ok", "error": None, "metrics": metrics}
