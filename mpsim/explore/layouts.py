"""Every layout worth simulating for a model on a cluster, as a chain of pluggable axes.

A layout is a dict of scenario fields (``parallel.tp``, ``parallel.schedule``,
``parallel.zero_stage``, ...). The enumeration walks ``AXES`` in order; each
axis looks at the choices made so far and offers its values, already restricted to the
ones a framework accepts (TP divides the heads and fits in a node, DP divides the
batch, the layers split over the pipeline chunks, ...). Axes further down therefore
see, say, the chosen TP when they pick the sequence-parallel options.

A new dimension is one more ``LayoutAxis`` in ``AXES``: a name, the fields it sets, and
a function from the context and the choices so far to its options. Nothing else
changes. Context parallelism (``max_cp``, off by default: it pays at long sequences),
expert parallelism (MoE models only) and ZeRO stages (0 and 1 by default) came that way.

A field the user pins with ``--set`` is not enumerated: its axis offers the pinned
value only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator

from mpsim.engine import rank_spans
from mpsim.errors import InputError
from mpsim.schedules import SCHEDULES, ScheduleError, build_schedule
from mpsim.schedules.zb_search import SEARCHED
from mpsim.specs.layout_checks import op_recompute_problem
from mpsim.specs.scenario import Scenario
from mpsim.specs.stack import LayerStackSpec
from mpsim.specs.stack_tp import plan_tensor_parallel

Choice = dict[str, Any]  # field -> value chosen by one axis
# lightest first: a heavier mode of a layout is dominated where a lighter one fits (planner.py);
# "selective" and "selective-op" are never enumerated together, so their order does not matter
RECOMPUTE_ORDER = ("none", "selective", "selective-op", "full")


def recompute_modes(scenario: Scenario) -> tuple[str, ...]:
    """The recompute modes the scenario's framework offers, lightest first: Megatron's (none,
    its core-attention ``selective``, full) for its layers and Transformer Engine's, and for plain
    PyTorch layers (``transformer_impl: pytorch``, torchtitan's kind) none, full and, where the
    model's matmuls follow the pattern, torchtitan's per-op policy; Megatron's selective
    recompute is not a PyTorch option, so a plan for such a run does not offer it."""
    if scenario.training.layers_impl != "pytorch" or isinstance(scenario.model, LayerStackSpec):
        return ("none", "selective", "full")
    return ("none", "full") if op_recompute_problem(scenario.model) else ("none", "selective-op", "full")


@dataclass(frozen=True)
class PlanContext:
    """What the axes need to know: the base scenario and the search limits."""

    scenario: Scenario
    max_microbatch_size: int = 8
    max_vpp: int = 8  # model chunks per rank; more multiplies pipeline transfers for little bubble gain
    schedules: tuple[str, ...] = ()  # empty: every registered schedule
    max_cp: int = 1  # context parallelism pays at long sequences only; raise it to search it
    zero_stages: tuple[int, ...] = (0, 1)  # ZeRO-2/3 trade time for memory; add them to search them

    @property
    def devices(self) -> int:
        return self.scenario.cluster.devices


@dataclass(frozen=True)
class LayoutAxis:
    """One dimension of the search: the fields it sets and its options given earlier choices."""

    name: str
    fields: tuple[str, ...]
    options: Callable[[PlanContext, Choice], Iterable[Choice]]


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def layer_split(num_layers: int, chunks: int) -> tuple[int, ...] | None | bool:
    """Layers per pipeline chunk: None for an even split, a tuple when the ends are lighter, False if neither.

    Megatron splits evenly, or lets the first and last stage hold fewer layers (they
    also hold the embedding and the LM head). So when the layers do not divide, each
    chunk gets ``ceil(layers / chunks)`` and the first and last give up one layer each
    (at most two layers short in all), as the Llama 3 405B run does with 126 layers on
    128 chunks.
    """
    if num_layers % chunks == 0:
        return None
    per_chunk = math.ceil(num_layers / chunks)
    short = per_chunk * chunks - num_layers
    if short > 2 or chunks < 2:
        return False
    layers = [per_chunk] * chunks
    layers[0] -= 1
    if short == 2:
        layers[-1] -= 1
    return tuple(layers)


def _dp(ctx: PlanContext, chosen: Choice) -> int:
    """Data-parallel size: the devices left after tensor, context and pipeline parallelism."""
    return ctx.devices // (chosen["parallel.tp"] * chosen.get("parallel.cp", 1) * chosen["parallel.pp"])


def _tp_splits(model, tp: int) -> bool:
    """Whether tensor parallelism of size ``tp`` splits every layer of the model."""
    if model.kind == "stack":  # layer stacks: every layer needs a split (docs/models.md)
        try:
            plan_tensor_parallel(model, tp, False)
        except InputError:
            return False
        return True
    return model.num_attention_heads % tp == 0 and model.kv_heads % tp == 0 and model.ffn_hidden_size % tp == 0


def _tp(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    model, system = ctx.scenario.model, ctx.scenario.cluster.system
    limit = ctx.devices if ctx.scenario.parallel.allow_tp_across_nodes else system.devices_per_node
    for tp in divisors(limit):
        if _tp_splits(model, tp) and ctx.devices % tp == 0:
            yield {"parallel.tp": tp}


def _cp(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    tp, seq = chosen["parallel.tp"], ctx.scenario.model.seq_length
    for cp in divisors(ctx.devices // tp):
        # the sequence splits into 2 x cp chunks (load balance under the causal mask)
        if cp <= ctx.max_cp and (cp == 1 or seq % (2 * cp) == 0):
            yield {"parallel.cp": cp}


def _pp(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    tp, cp = chosen["parallel.tp"], chosen.get("parallel.cp", 1)
    batch = ctx.scenario.parallel.global_batch_size
    for pp in divisors(ctx.devices // (tp * cp)):
        dp = ctx.devices // (tp * cp * pp)
        if batch % dp == 0 and layer_split(ctx.scenario.model.num_layers, pp) is not False:
            yield {"parallel.pp": pp}


def _ep(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    moe = ctx.scenario.model.moe
    if moe is None:
        return
    # Megatron-Core's expert layout over the tp x cp x dp ranks of a stage: each expert split over
    # etp of them, ep groups of those (mpsim/specs/layout.py, _expert_parallel_sizes). Two expert
    # TP sizes are tried: tp, Megatron-Core's default, and 1, which folds the tensor-parallel ranks
    # into expert parallelism as NVIDIA's MoE recipes do (the Megatron-Core MoE report: "expert TP
    # is always 1"); another is planned where --set parallel.etp pins it
    tp = chosen["parallel.tp"]
    stage_ranks = tp * chosen.get("parallel.cp", 1) * _dp(ctx, chosen)
    for etp in sorted({tp, 1}, reverse=True):
        if moe.expert_ffn_hidden_size % etp:
            continue
        for ep in divisors(moe.num_experts):
            if stage_ranks % (ep * etp) == 0:
                yield {"parallel.ep": ep, "parallel.etp": etp}


@lru_cache(maxsize=None)
def schedule_vpp_range(name: str, ceiling: int) -> tuple[int, int]:
    """(fewest, most) model chunks per rank a registered schedule runs, capped at ``ceiling``.

    The registry states it for the schedules it knows (``min_vpp``/``max_vpp``); for an
    entry without those, it is found by trying the schedule on a small pipeline, so the
    planner stays right for schedules added later.
    """
    kind = SCHEDULES.get(name)
    low, high = getattr(kind, "min_vpp", None), getattr(kind, "max_vpp", 0)
    if isinstance(low, int) and (high is None or isinstance(high, int)):
        return low, min(ceiling, high) if high is not None else ceiling
    works = []
    for vpp in range(1, ceiling + 1):
        try:
            build_schedule(name, 2, vpp, 4 * vpp, timer=rank_spans)
        except ScheduleError:
            continue
        works.append(vpp)
    return (works[0], works[-1]) if works else (1, 0)


def _chunks(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    pp, layers = chosen["parallel.pp"], ctx.scenario.model.num_layers
    for vpp in range(1, ctx.max_vpp + 1):
        split = layer_split(layers, pp * vpp)
        if split is not False and (vpp == 1 or pp > 1):
            yield {"parallel.vpp": vpp, "parallel.layers_per_stage": list(split) if split else None}


def _schedule(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    vpp = chosen["parallel.vpp"]
    # searched schedules (zb-1p, zb-2p) run a search of about a second per layout, too slow
    # to try on every layout by default; ask for them by name
    for name in ctx.schedules or tuple(name for name in SCHEDULES if name not in SEARCHED):
        if getattr(SCHEDULES.get(name), "chains", 1) > 1:
            # several pipelines over the same blocks (dualpipe) take one layer count per block,
            # not the per-chunk split _chunks proposes; run them with mpsim run or sweep
            continue
        low, high = schedule_vpp_range(name, ctx.max_vpp)
        if low <= vpp <= high:
            yield {"parallel.schedule": name}


def _microbatch(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    dp = _dp(ctx, chosen)
    per_replica = ctx.scenario.parallel.global_batch_size // dp
    for size in range(1, min(per_replica, ctx.max_microbatch_size) + 1):
        if per_replica % size == 0:
            yield {"parallel.microbatch_size": size}


def _recompute(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    for mode in recompute_modes(ctx.scenario):
        yield {"parallel.recompute": mode}


def _sequence_parallel(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    tp, cp = chosen["parallel.tp"], chosen.get("parallel.cp", 1)
    yield {"parallel.sequence_parallel": False}
    if tp > 1 and (ctx.scenario.model.seq_length // cp) % tp == 0:
        yield {"parallel.sequence_parallel": True}


def _zero(ctx: PlanContext, chosen: Choice) -> Iterable[Choice]:
    # stage 1 shards the optimizer state over DP, 2 also the gradients, 3 also the weights
    for stage in ctx.zero_stages:
        if stage == 0 or _dp(ctx, chosen) > 1:
            yield {"parallel.zero_stage": stage}


# Order matters twice: an axis may depend on the ones above it, and layouts that differ only
# in the axes at the bottom share their costs (the planner caches them per layout minus the
# schedule), so the schedule is the innermost axis.
AXES: list[LayoutAxis] = [
    LayoutAxis("tensor parallel", ("parallel.tp",), _tp),
    LayoutAxis("context parallel", ("parallel.cp",), _cp),
    LayoutAxis("pipeline parallel", ("parallel.pp",), _pp),
    LayoutAxis("expert parallel", ("parallel.ep", "parallel.etp"), _ep),
    LayoutAxis("model chunks per rank", ("parallel.vpp", "parallel.layers_per_stage"), _chunks),
    LayoutAxis("microbatch size", ("parallel.microbatch_size",), _microbatch),
    LayoutAxis("sequence parallel", ("parallel.sequence_parallel",), _sequence_parallel),
    LayoutAxis("ZeRO stage", ("parallel.zero_stage",), _zero),
    LayoutAxis("recompute", ("parallel.recompute",), _recompute),
    LayoutAxis("schedule", ("parallel.schedule",), _schedule),
]


OPTIONAL_AXES = {"expert parallel"}


def current_value(scenario: Scenario, field: str) -> Any:
    """The value of a dotted field in a scenario."""
    node: Any = scenario
    for part in field.split("."):
        node = getattr(node, part)
    return node


def enumerate_layouts(ctx: PlanContext, pinned: Iterable[str] = (), axes: list[LayoutAxis] | None = None
                      ) -> Iterator[Choice]:
    """Every layout, depth first in axis order (deterministic)."""
    axes = AXES if axes is None else axes
    pinned = set(pinned)

    def options(axis: LayoutAxis, chosen: Choice) -> Iterable[Choice]:
        fixed = [f for f in axis.fields if f in pinned]
        if not fixed:
            return axis.options(ctx, chosen)
        # the user chose: offer only the options that agree with the pinned fields, or the pinned values
        want = {f: current_value(ctx.scenario, f) for f in fixed}
        matching = [o for o in axis.options(ctx, chosen) if all(o.get(f) == v for f, v in want.items())]
        return matching or [want]

    def walk(depth: int, chosen: Choice) -> Iterator[Choice]:
        if depth == len(axes):
            yield dict(chosen)
            return
        offered = list(options(axes[depth], chosen))
        if not offered and axes[depth].name in OPTIONAL_AXES:
            offered = [{}]  # an axis that does not apply (experts of a dense model) sets nothing
        for option in offered:
            yield from walk(depth + 1, {**chosen, **option})

    yield from walk(0, {})
