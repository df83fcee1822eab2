"""Step-time samples of one data-parallel replica: the simulated step re-run with seeded op-time draws.

Each draw multiplies every duration of the engine's input by a factor of mean 1 drawn
for the op kinds that make it up: an action of a stage lasting ``d`` seconds, of which a
share ``s_k`` is ops of kind ``k``, lasts ``d * (1 + sum_k s_k (X_k - 1))``, each ``X_k``
lognormal with mean 1 and the kind's coefficient of variation. Shares come from the
op-by-op prices of the pass (overlap ignored: a hidden collective still counts at its
own length). Pipeline sends draw with the ``transfer`` kind, gradient reductions and
pair syncs with ``collective``, the optimizer step with ``memory``.

One draw is made per (stage, pass kind) and per link direction (an overlapped pair, and a
pass that gathers its parameters first, ``F+gather``, are kinds of their own), and holds
for every microbatch of the step: the engine prices an action once per (stage, kind), so
what is modelled is a device, link or group running slow or fast for a whole step (power
and thermal states, a congested link), not kernel-to-kernel jitter, which would average
out over a step's microbatches. docs/reliability.md states this.

With every coefficient zero no step is re-run: each sample is the simulated step itself,
to the bit. The same seed gives the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from mpsim.cost.actions import CostModel
from mpsim.engine import simulate_compiled, supports
from mpsim.engine.consecutive import steady_period
from mpsim.engine.core import TransferSpec
from mpsim.engine.excise import simulate_excised
from mpsim.reliability.op_variation import OP_KINDS
from mpsim.simulate import SimulationResult
from mpsim.workload.ops import Op, Overlap, Pass

# most samples one run may draw: each is one engine run (about 0.01-0.1 s)
MAX_SAMPLES = 100_000


@dataclass(frozen=True)
class ReplicaSamples:
    """Step times of one data-parallel replica, one per draw, in draw order."""

    step_time_s: tuple[float, ...]
    seed: int
    cv: dict[str, float]


def pass_shares(work: Pass, model: CostModel) -> dict[str, float]:
    """Share of a pass's op seconds by op kind (summing to 1; empty for a pass of no ops)."""
    seconds = dict.fromkeys(OP_KINDS[:-1], 0.0)

    def add(op: Op) -> None:
        if op.kind == "collective":
            seconds["collective"] += model.collective_s(op)
        else:
            seconds[op.kind] += model.compute.time(op)

    for block in work:
        if block.gather is not None:
            add(block.gather)
        for item in block.items:
            if isinstance(item, Overlap):
                add(item.comm)
                for op in item.compute:
                    add(op)
            else:
                add(item)
    total = sum(seconds.values())
    return {kind: value / total for kind, value in seconds.items() if value > 0} if total > 0 else {}


def action_shares(result: SimulationResult) -> dict[tuple, dict[str, float]]:
    """Op-kind shares of every duration key of the engine input (stage passes and overlapped pairs)."""
    model = CostModel(result.scenario, result.layout)
    per_pass: dict[tuple[int, str], dict[str, float]] = {}

    def of(stage: int, kind: str) -> dict[str, float]:
        if (stage, kind) not in per_pass:
            # priced on the device the stage runs on (a slow GPU or another part of a mixed cluster)
            here = model.on_rank(result.schedule.stage_to_rank[stage])
            per_pass[(stage, kind)] = pass_shares(result.workload.pass_of(stage, kind), here)
        return per_pass[(stage, kind)]

    shares = {}
    for key in result.engine_input.action_s:
        if len(key) == 2:
            shares[key] = of(*key)
            continue
        # an overlapped forward+backward pair: the two passes weighted by their own durations
        forward_s, backward_s = result.costs[key[:2]].duration_s, result.costs[key[2:]].duration_s
        total = forward_s + backward_s
        mixed: dict[str, float] = {}
        for part, weight in ((of(*key[:2]), forward_s), (of(*key[2:]), backward_s)):
            for kind, share in part.items():
                mixed[kind] = mixed.get(kind, 0.0) + share * weight / total
        shares[key] = mixed if total > 0 else {}
    return shares


def lognormal_factors(rng: np.random.Generator, cv: float, count: int) -> np.ndarray:
    """``count`` draws of mean exactly 1 and coefficient of variation ``cv`` (all 1.0 when ``cv`` is 0)."""
    if cv == 0:
        return np.ones(count)
    sigma = math.sqrt(math.log1p(cv * cv))
    return np.exp(rng.normal(-0.5 * sigma * sigma, sigma, count))


def sample_replica(result: SimulationResult, cv: dict[str, float], samples: int, seed: int) -> ReplicaSamples:
    """``samples`` step times of one replica with op times drawn by ``cv`` (see the module doc)."""
    nominal = result.timeline.step_time_s
    if all(value == 0 for value in cv.values()):
        return ReplicaSamples((nominal,) * samples, seed, dict(cv))
    rng = np.random.default_rng(seed)
    inp = result.engine_input
    overlapping = result.scenario.training.optimizer_post_validation
    action_factors = {}
    for key, shares in sorted(action_shares(result).items(), key=lambda item: repr(item[0])):
        factor = np.ones(samples)
        for kind in OP_KINDS[:-1]:
            share = shares.get(kind, 0.0)
            if share > 0 and cv[kind] > 0:
                factor = factor + share * (lognormal_factors(rng, cv[kind], samples) - 1.0)
        action_factors[key] = factor
    transfer_factors = {key: lognormal_factors(rng, cv["transfer"], samples) for key in sorted(inp.transfer_s)}
    grad_factors = {stage: [lognormal_factors(rng, cv["collective"], samples) for _ in buckets]
                    for stage, buckets in sorted(inp.grad_buckets.items())}
    per_action_factors = {key: [lognormal_factors(rng, cv["collective"], samples) for _ in buckets]
                          for key, buckets in sorted(inp.action_buckets.items(), key=lambda item: repr(item[0]))}
    sync_factors = [lognormal_factors(rng, cv["collective"], samples) for _ in inp.pair_syncs]
    optimizer_factors = [lognormal_factors(rng, cv["memory"], samples) for _ in inp.finalize_s]
    engine = simulate_compiled if supports(inp) else simulate_excised
    links = inp.transfer_links
    times = []
    for i in range(samples):
        drawn = replace(
            inp,
            action_s={key: seconds * float(action_factors[key][i]) for key, seconds in inp.action_s.items()},
            transfer_s={key: seconds * float(transfer_factors[key][i]) for key, seconds in inp.transfer_s.items()},
            # with shared links the engine times a send by its link spec: drawn alike
            transfer_links=None if links is None else {
                key: TransferSpec(spec.latency_s * float(transfer_factors[key][i]),
                                  spec.busy_s * float(transfer_factors[key][i]), spec.links)
                for key, spec in links.items()},
            grad_buckets={stage: tuple(bucket._replace(duration_s=bucket.duration_s * float(f[i]))
                                       for bucket, f in zip(buckets, grad_factors[stage]))
                          for stage, buckets in inp.grad_buckets.items()},
            action_buckets={key: tuple(bucket._replace(duration_s=bucket.duration_s * float(f[i]))
                                       for bucket, f in zip(buckets, per_action_factors[key]))
                            for key, buckets in inp.action_buckets.items()},
            pair_syncs=tuple((a, b, seconds * float(f[i]), label)
                             for (a, b, seconds, label), f in zip(inp.pair_syncs, sync_factors)),
            finalize_s=tuple(seconds * float(f[i]) for seconds, f in zip(inp.finalize_s, optimizer_factors)),
        )
        # steps that overlap their neighbours: the drawn step's period in a long run of it
        times.append(steady_period(drawn).period_s if overlapping else engine(drawn).step_time_s)
    return ReplicaSamples(tuple(times), seed, dict(cv))

