"""The layout planner: every valid layout of a model on a cluster, checked, bounded, simulated, ranked.

``plan`` builds the base scenario (model, system, device count, sequence length, global
batch, any ``--set``), enumerates layouts (``layouts.py``) and evaluates them in two
passes through ``runner.run_points``, so it gets the process pool, Ray, the progress bar
and the resumable results file like any sweep.

**Check pass**, every layout, cheap:

1. rules: the scenario model and ``resolve`` (``mpsim/resolve.py``) reject what a framework would
   (status ``invalid``);
2. memory: the model state per rank, then with the schedule's in-flight activations
   (``results.memory.rank_memory``, as the report computes it, over the shortened walk of
   ``memwalk.py``), no timeline needed (status ``oom``);
3. dominance: recompute only adds work to the same actions, and the step time can only
   grow when a duration grows (every time is a max of sums), so selective or full
   recompute is not simulated when less recompute fits too (status ``dominated``);
4. a lower bound on the step time (``bounds.py``); the layout ``fits``.

**Simulation pass**, in increasing order of the bound: layouts are simulated in rounds
until the bound of the next one exceeds the step time of the ``top``-th best found so
far; no layout left can beat it (status ``bound``). So the top is exactly what
simulating every layout would give, at a fraction of the cost (``prune=False``
simulates everything).

Costs are cached per worker for layouts that differ only in the schedule: the cost of a
stage's passes does not depend on the order the schedule runs them in, so each layout
group prices them once per stage placement (``Prepared.schedule_costs``; the bound's
transfers, optimizer steps and DP buckets likewise, ``Prepared.placed_inputs``), and a
pass equal to one another group priced alike is not priced again
(``cost.shared_prices.sharing``). The check pass never holds a
full schedule longer than it takes to shorten it: per (schedule, pp, vpp, microbatches)
it keeps the lists with no actions (model state), the memory walk's short lists as
arrays, one item per duration key and the bound's item counts (``plancache.Short``), and
a layout's memory check takes all of its ranks at once (``memfast.LayoutMemory``), the
same sums in the same order as ``results.memory.rank_memory``. With several workers its
chunks keep the layouts that share schedules together (``chunk_group``).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from math import gcd
from typing import Any, Sequence

from mpsim.cost.shared_prices import sharing as sharing_prices
from mpsim.cost.collectives import remembering
from mpsim.engine import simulate as engine_simulate, simulate_compiled, supports
from mpsim.engine.excise import simulate_excised
from mpsim.errors import InputError
from mpsim.explore.axes import Point
from mpsim.explore.bounds import step_lower_bound
from mpsim.explore.evaluate import error_text, failure, schedule_for, summary_metrics
from mpsim.explore.layouts import RECOMPUTE_ORDER, PlanContext, enumerate_layouts
from mpsim.explore.planbase import apply_fields
from mpsim.explore.plancache import COLLECTIVES, MEMORY, PREPARED, PRICES, Prepared, remember, short_schedule
from mpsim.explore.progress import Progress
from mpsim.explore.pools import Session
from mpsim.explore.runner import RunControl, RunReport, run_points
from mpsim.explore.store import canonical_json
from mpsim.resolve import resolve
from mpsim.schedules.unshard import mark_unsharding
from mpsim.simulate import SimulationResult, engine_input, overlap_steps
from mpsim.specs.scenario import Scenario
from mpsim.units import format_need

RECOMPUTE_FIELD = "parallel.recompute"
SCHEDULE_FIELD = "parallel.schedule"
ZERO_FIELD = "parallel.zero_stage"


def sorted_items(fields: dict[str, Any]) -> tuple:
    """A layout's fields as sorted (name, value) pairs, lists as tuples: hashable, in one order."""
    return tuple(sorted((name, tuple(value) if isinstance(value, list) else value) for name, value in fields.items()))


class LayoutFields(dict):
    """A layout's fields, with their ``sorted_items`` made once: a point's cache keys (several per
    point: the layout, its group, its state, its placement) are cut from them without sorting again."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.items_sorted = sorted_items(self)


@dataclass(frozen=True)
class PlanEvaluator:
    """Evaluates one layout of the base scenario: ``mode`` is "check" or "simulate" (module doc)."""

    scenario: Scenario
    mode: str = "check"
    engine: str = "fast"
    identity: str = ""
    # the recompute modes the plan enumerates: a lighter mode dominates a heavier one only when
    # it is among them (a --set parallel.recompute pin leaves one, which nothing dominates)
    recompute_modes: tuple[str, ...] = RECOMPUTE_ORDER

    def _scenario(self, fields: dict[str, Any]) -> tuple[Scenario, Prepared]:
        group = self._key(fields, SCHEDULE_FIELD)
        prepared = PREPARED.get(group)
        if prepared is None:
            scenario = apply_fields(self.scenario, fields)
            # a ZeRO stage below 3 changes no op of a stage: such layouts share one workload
            alike = self._key(fields, SCHEDULE_FIELD, ZERO_FIELD) if scenario.parallel.zero_stage < 3 else None
            prepared = remember(PREPARED, group, Prepared(scenario, resolve(scenario), alike))
        if SCHEDULE_FIELD in fields:
            return prepared.with_schedule(fields[SCHEDULE_FIELD]), prepared
        return prepared.scenario, prepared

    def _key(self, fields: dict[str, Any], *leaving: str) -> tuple:
        """The exact key of ``fields`` (but ``leaving``) in this plan, for the process's caches."""
        items = fields.items_sorted if isinstance(fields, LayoutFields) else sorted_items(fields)
        if leaving:
            items = tuple(item for item in items if item[0] not in leaving)
        return (self.identity, *items)

    def _memory(self, fields: dict[str, Any]) -> tuple[float, float, str, bool]:
        """(peak bytes of the fullest rank, capacity, its largest category, exact), memoized per layout.

        Model state and buffers alone (the schedule with no actions: no activations) are
        checked first; when they already overflow, that lower bound is the answer
        (``exact`` False). They do not depend on recompute, so layouts that differ only
        in it share the check.
        """
        key = self._key(fields)
        known = MEMORY.get(key)
        if known is not None:
            return known
        state_key = self._key(fields, RECOMPUTE_FIELD)
        state = MEMORY.get(state_key)
        if state is not None and state[0] > state[1] and fields.get(RECOMPUTE_FIELD) in RECOMPUTE_ORDER:
            # the state overflows whatever the recompute; and since it was computed, the same
            # layout with another mode passed the rules and got its schedule, which no rule
            # or schedule ties to the mode: this layout would too, and end here the same way
            return remember(MEMORY, key, state)
        scenario, prepared = self._scenario(fields)
        short = short_schedule(scenario, prepared.layout)
        if state is None:
            # with no actions, the schedule enters the state only through which stages each rank
            # holds (the group's layout and workload are shared by its schedules already), so
            # schedules that place stages alike share the check
            placed_key = (self._key(fields, RECOMPUTE_FIELD, SCHEDULE_FIELD), len(short.idle.actions),
                          short.idle.stage_to_rank)
            state = MEMORY.get(placed_key)
            if state is None:
                worst = prepared.memory.fullest(short.idle)
                state = remember(MEMORY, placed_key, (worst.peak_memory_bytes, worst.capacity_bytes,
                                                        worst.largest_category, False))
            remember(MEMORY, state_key, state)
        if state[0] > state[1]:
            return remember(MEMORY, key, state)
        worst = prepared.memory.fullest(short.idle, short.memory)
        return remember(MEMORY, key, (worst.peak_memory_bytes, worst.capacity_bytes, worst.largest_category,
                                        True))

    def _lighter_fits(self, fields: dict[str, Any]) -> str | None:
        """A lighter recompute mode that fits too, if any (the heavier one is then dominated)."""
        mode = fields.get(RECOMPUTE_FIELD)
        if mode not in RECOMPUTE_ORDER:
            return None
        for lighter in RECOMPUTE_ORDER[:RECOMPUTE_ORDER.index(mode)]:
            if lighter not in self.recompute_modes:
                continue
            try:
                peak, capacity, _, _ = self._memory(LayoutFields({**fields, RECOMPUTE_FIELD: lighter}))
            except InputError:
                continue
            if peak <= capacity:
                return lighter
        return None

    def chunk_group(self, point: Point) -> Any:
        """What the runner keeps on one worker: layouts that share stage shapes and schedules, so
        one worker prices each shape's passes (``cost.shared_prices``) and generates and shortens
        each schedule (``plancache.short_schedule``). A stage's passes are set by tp, cp, the
        microbatch size and the layers per model chunk (the layer count over pp x vpp); a
        schedule by pp, vpp and the microbatches per replica, global batch x tp x cp x pp /
        (devices x microbatch size). Both are fixed within a group of one pp x vpp and one ratio
        tp x cp / microbatch size (in lowest terms). Grouping by schedule alone spread the
        pricing of each shape over the workers, which cost more than the schedules
        (``benchmarks/plan_speed.py``). The simulation pass has no such group: its layouts are
        few and long, spread for balance."""
        if self.mode != "check":
            return None
        fields, base = dict(point), self.scenario.parallel
        width = fields.get("parallel.tp", base.tp) * fields.get("parallel.cp", base.cp)
        size = fields.get("parallel.microbatch_size", base.microbatch_size)
        common = gcd(width, size)  # the ratio in lowest terms
        return (width // common, size // common,
                fields.get("parallel.pp", base.pp) * fields.get("parallel.vpp", base.vpp))

    @property
    def collect_after_chunk(self) -> bool:
        """Checks make few reference cycles: the collector may wait for the end of a chunk (``pools.py``)."""
        return self.mode == "check"

    def evaluate(self, point: Point) -> dict[str, Any]:
        with remembering(COLLECTIVES), sharing_prices(PRICES):
            return self._evaluate(LayoutFields(point))

    def _evaluate(self, fields: dict[str, Any]) -> dict[str, Any]:
        try:
            if self.mode == "check":
                # checked before this layout's own memory: the lighter mode was usually just seen
                lighter = self._lighter_fits(fields)
                if lighter is not None:
                    return failure("dominated", f"recompute={lighter} fits too and does less work")
            peak, capacity, largest, exact = self._memory(fields)
        except InputError as exc:
            return failure("invalid", str(exc))
        if peak > capacity:
            needs = "needs" if exact else "needs at least"
            return failure("oom", f"{needs} {format_need(peak, capacity)}, mostly {largest}",
                           peak_memory_bytes=peak, capacity_bytes=capacity, largest=largest, exact=exact)
        try:
            if self.mode == "check":
                return self._check(fields, peak, capacity)
            return self._simulate(fields)
        except InputError as exc:
            return failure("invalid", str(exc))

    def _check(self, fields: dict[str, Any], peak: float, capacity: float) -> dict[str, Any]:
        scenario, prepared = self._scenario(fields)
        short = short_schedule(scenario, prepared.layout)
        schedule = short.distinct  # the full schedule's stages, ranks and chains; its counts are short.counts
        costs = prepared.schedule_costs(schedule, distinct=True)
        # the bound needs the durations, the chains' transfers (a gradient goes back over the
        # cut its activation came through), the optimizer steps and each stage's final DP buckets
        # of the engine input; the rest of it (the links that sends and buckets share, the
        # buckets some actions start each time they run) waits for simulation
        transfer, finalize, buckets = prepared.placed_inputs(schedule)
        metrics = self._bound(schedule, {key: cost.duration_s for key, cost in costs.items()}, transfer, finalize,
                              costs, buckets, scenario.training.overlap_grad_reduce, short.counts,
                              overlapping=scenario.training.optimizer_post_validation)
        metrics.update(peak_memory_bytes=peak, capacity_bytes=capacity)
        return {"status": "fits", "error": None, "metrics": metrics}

    @staticmethod
    def _bound(schedule: Any, action_s: dict, transfer_s: dict, finalize_s: Sequence[float],
               costs: dict, grad_buckets: dict, overlap_grad_sync: bool, counts: list | None = None,
               overlapping: bool = False) -> dict[str, float]:
        """The step-time lower bound and its busiest rank's split (``bounds.py``); ``overlapping``:
        of a step that overlaps its neighbours (training.optimizer_post_validation)."""
        bound = step_lower_bound(schedule, action_s, transfer_s, finalize_s,
                                 {key: cost.tp_exposed_s for key, cost in costs.items()}, counts, grad_buckets,
                                 overlap_grad_sync, overlapping_steps=overlapping)
        return {"lower_bound_s": bound.lower_bound_s, "bound_rank": bound.rank, "bound_head_s": bound.head_s,
                "bound_busy_s": bound.busy_s, "bound_tp_exposed_s": bound.tp_exposed_s,
                "bound_optimizer_s": bound.optimizer_s, "bound_tail_s": bound.tail_s, "bound_dp_s": bound.dp_s}

    def _simulate(self, fields: dict[str, Any]) -> dict[str, Any]:
        from mpsim.results import summarize

        scenario, prepared = self._scenario(fields)
        layout, workload, model = prepared.layout, prepared.workload, prepared.model
        schedule = schedule_for(scenario, layout, None)
        if layout.fsdp_gathering is not None:  # the passes that gather their chunk's parameters first
            schedule = mark_unsharding(schedule, layout.fsdp_gathering)
        costs = prepared.schedule_costs(schedule)
        inp = engine_input(scenario, layout, workload, schedule, model, costs)
        try:
            if self.engine != "fast":
                timeline = engine_simulate(inp)  # every action in the event engine: the exhaustive check
            elif supports(inp):
                timeline = simulate_compiled(inp)
            else:  # contended: the event engine, a repeated middle run once (engine/excise.py)
                timeline = simulate_excised(inp)
            timeline = overlap_steps(scenario, inp, timeline)
            result = SimulationResult(scenario, prepared.layout, inp.schedule, prepared.workload, costs, timeline, inp)
            metrics = {**summary_metrics(summarize(result)),
                       **self._bound(schedule, inp.action_s, inp.transfer_s, inp.finalize_s, costs, inp.grad_buckets,
                                     inp.overlap_grad_sync, overlapping=scenario.training.optimizer_post_validation)}
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded; the plan goes on
            return failure("error", error_text(exc))
        return {"status": "ok", "error": None, "metrics": metrics}


@dataclass
class PlanResult:
    """Every layout of a plan and what became of it (``planreport.py`` ranks and explains)."""

    scenario: Scenario
    points: list[Point]
    records: list[dict | None]
    top: int
    elapsed_s: float = 0.0
    simulated: int = 0  # layouts simulated in this run
    reused: int = 0  # records taken from the results file
    workers: int = 1
    backend: str = "local"
    stopped: bool = False
    passes: list[RunReport] = field(default_factory=list)


def plan_identity(scenario: Scenario) -> str:
    """What the results-file keys of a plan hash besides the layout: the whole base scenario."""
    return hashlib.sha256(canonical_json(scenario.model_dump(mode="json")).encode()).hexdigest()[:20]


def _not_a_candidate(record: dict) -> bool:
    return record.get("status") != "fits"


def _why_no_layout(scenario: Scenario, pinned: Sequence[str], schedules: Sequence[str] = ()) -> InputError:
    """The error when nothing was enumerated: a pinned field's own rule where one breaks it (a
    ``--set parallel.tp=3`` that does not divide the heads), else the sizes to check."""
    from mpsim.specs.layout import resolve_layout

    if pinned:
        try:
            resolve_layout(scenario)
        except InputError as exc:
            if exc.field in pinned:
                return InputError(f"no layout with the --set values: {exc.message}", f"--set {exc.field}")
    checks = ["--devices", "--global-batch"] + (["the --set values"] if pinned else []) \
        + (["--schedules"] if schedules else [])
    return InputError("no layout satisfies the model's and the cluster's divisibility rules; check "
                      + (", ".join(checks[:-1]) + " and " + checks[-1]))


def plan(scenario: Scenario, *, top: int = 10, pinned: Sequence[str] = (), max_microbatch_size: int = 8,
         max_vpp: int = 8, schedules: Sequence[str] = (), max_cp: int = 1, zero_stages: Sequence[int] = (0, 1),
         engine: str = "fast", prune: bool = True,
         backend: str = "local", workers: int | None = None, ray_address: str | None = None,
         out: str | None = None, progress: bool | None = None, round_size: int | None = None) -> PlanResult:
    """Enumerate, check, bound and simulate the layouts of ``scenario``'s model on its cluster."""
    started = time.monotonic()
    ctx = PlanContext(scenario, max_microbatch_size, max_vpp, tuple(schedules), max_cp, tuple(zero_stages))
    points: list[Point] = [tuple(layout.items()) for layout in enumerate_layouts(ctx, pinned)]
    if not points:
        raise _why_no_layout(scenario, pinned, schedules)
    identity = plan_identity(scenario)
    keep = max(1, top)
    with Session(backend, workers, ray_address) as session:
        modes = tuple(m for m in RECOMPUTE_ORDER if any(dict(p).get(RECOMPUTE_FIELD) == m for p in points))
        checked = run_points(PlanEvaluator(scenario, "check", engine, identity, modes), points, session,
                             RunControl(out=out, progress=progress, label="plan: check"))
        result = PlanResult(scenario, points, list(checked.records), keep, workers=checked.workers,
                            backend=checked.backend, reused=checked.reused, passes=[checked])
        records = result.records
        order = sorted((r["metrics"]["lower_bound_s"], i) for i, r in enumerate(records)
                       if r is not None and r["status"] == "fits")
        best = sorted(r["metrics"]["step_time_s"] for r in records if r is not None and r["status"] == "ok")
        simulator = PlanEvaluator(scenario, "simulate", engine, identity)
        # a fixed round size keeps which layouts get simulated the same for any worker count
        size = round_size or max(2 * keep, 32)
        bar = Progress(0, "plan: simulate", progress)
        position = 0
        while position < len(order):
            cutoff = best[keep - 1] if prune and len(best) >= keep else float("inf")
            batch = []
            while position < len(order) and len(batch) < size and order[position][0] <= cutoff:
                batch.append(order[position][1])
                position += 1
            if not batch:
                break
            bar.total += len(batch)
            done = run_points(simulator, [points[i] for i in batch], session,
                              RunControl(out=out, reuse=_not_a_candidate, progress=False, label="plan: simulate",
                                         bar=bar))
            result.passes.append(done)
            result.simulated += done.computed
            for index, record in zip(batch, done.records):
                records[index] = record
                if record is not None and record["status"] == "ok":
                    best.append(record["metrics"]["step_time_s"])
            best.sort()
        bar.finish()
    cutoff = best[keep - 1] if len(best) >= keep else float("inf")
    for index, record in enumerate(records):
        if record is not None and record["status"] == "fits":
            bound = record["metrics"]["lower_bound_s"]
            records[index] = {**record, "status": "bound",
                              "error": f"lower bound {bound:.3f} s > step time of #{keep} {cutoff:.3f} s"}
    result.elapsed_s = time.monotonic() - started
    return result


def layout_label(point: dict[str, Any] | Point) -> str:
    """``tp8 pp16 vpp8 mbs1 interleaved-1f1b sp zero1 rc=none`` (the fields the planner varies)."""
    p = dict(point)
    parts = [f"tp{p.get('parallel.tp', 1)}"]
    for name in ("cp", "ep"):
        if p.get(f"parallel.{name}", 1) != 1:
            parts.append(f"{name}{p[f'parallel.{name}']}")
    if p.get("parallel.etp") not in (None, p.get("parallel.tp", 1)):  # experts folded over TP ranks
        parts.append(f"etp{p['parallel.etp']}")
    parts.append(f"pp{p.get('parallel.pp', 1)}")
    if p.get("parallel.vpp", 1) != 1:
        parts.append(f"vpp{p['parallel.vpp']}")
    parts.append(f"mbs{p.get('parallel.microbatch_size', 1)}")
    if SCHEDULE_FIELD in p:
        parts.append(str(p[SCHEDULE_FIELD]))
    if p.get("parallel.sequence_parallel"):
        parts.append("sp")
    if p.get("parallel.zero_stage"):
        parts.append(f"zero{p['parallel.zero_stage']}")
    if RECOMPUTE_FIELD in p:
        parts.append(f"rc={p[RECOMPUTE_FIELD]}")
    return " ".join(parts)
