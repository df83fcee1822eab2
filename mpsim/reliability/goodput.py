"""Expected wall-clock time of a whole training run with failures, checkpoints and restarts.

The run needs ``W`` seconds of failure-free training (steps times the step time). Every
``tau`` seconds of training it writes a checkpoint taking ``delta`` seconds; an
interruption loses the work since the last checkpoint and costs a restart of ``R``
seconds (restarting the job plus loading the checkpoint). Interruptions arrive as a
Poisson process of mean time between failures ``M``, during training, checkpoint writes
and restarts alike. Daly (2006, "A higher order estimate of the optimum checkpoint
interval for restart dumps", Future Generation Computer Systems 22(3)) gives the
expected wall-clock time of that process exactly::

    T = M * exp(R / M) * (exp((tau + delta) / M) - 1) * W / tau

It splits, per segment of ``tau`` training and one checkpoint, into (with
``a = tau + delta`` and ``k = exp(a / M) - 1`` failed attempts expected):

* the segment's own training ``tau`` and checkpoint write ``delta``;
* lost work ``M k - a``: ``k`` failed attempts, each losing the time it had run
  (``M - a / k`` on average, a failure conditioned to fall inside the attempt);
* restarts ``k M (exp(R / M) - 1)``: one restart after each failed attempt, each itself
  repeated until it completes without failure.

These add up to ``T / (W / tau)``. The interruptions expected over the run are
``T / M``. The interval is Young's first-order optimum ``sqrt(2 delta M)`` (Young 1974,
"A first order approximation to the optimum checkpoint interval", CACM 17(9)), or
Daly's higher-order one, used by default::

    tau = sqrt(2 delta M) (1 + sqrt(delta / (2M)) / 3 + (delta / (2M)) / 9) - delta   (delta < 2M)
    tau = M                                                                          (otherwise)

The last segment's checkpoint and a fractional last segment are counted like the others
(a whole-run error of at most one interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpsim.errors import InputError
from mpsim.results.throughput import throughput_unit
from mpsim.reliability.failures import FailureModel, job_failures
from mpsim.simulate import SimulationResult
from mpsim.workload.memory import model_state_bytes

SECONDS_PER_DAY = 86_400.0
WEIGHT_BYTES_PER_PARAM = 2  # bf16 weights (fp8 runs keep bf16 weights too)


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimal training time between checkpoints."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimal training time between checkpoints (see the module doc)."""
    if math.isinf(mtbf_s):
        return math.inf
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - checkpoint_s


# a span this many times the mean time between failures completes once in about e^50 tries
MAX_SPANS_PER_MTBF = 50.0


@dataclass(frozen=True)
class RunTime:
    """The expected wall-clock time of a run and where it went, in seconds."""

    training_s: float  # failure-free training: steps x step time
    checkpoint_s: float  # writing checkpoints
    lost_work_s: float  # training redone after interruptions (partial checkpoint writes included)
    restart_s: float  # restarting and loading checkpoints, interrupted restarts included
    interruptions: float  # expected number over the run
    interval_s: float  # training time between checkpoints

    @property
    def wall_s(self) -> float:
        return self.training_s + self.checkpoint_s + self.lost_work_s + self.restart_s

    @property
    def effective_fraction(self) -> float:
        """Share of wall-clock time spent on training that is kept."""
        return self.training_s / self.wall_s if self.wall_s > 0 else 1.0


def expected_run(training_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                 mtbf_s: float) -> RunTime:
    """Daly's expected run time of ``training_s`` of training, split by cause (see the module doc)."""
    if math.isinf(mtbf_s):  # no failures: only checkpoint writes
        segments = training_s / interval_s if math.isfinite(interval_s) else 0.0
        return RunTime(training_s, segments * checkpoint_s, 0.0, 0.0, 0.0, interval_s)
    segments = training_s / interval_s
    attempt_s = interval_s + checkpoint_s
    for what, seconds in (("a checkpoint interval and its write", attempt_s), ("a restart", restart_s)):
        if seconds / mtbf_s > MAX_SPANS_PER_MTBF:
            # e^50 failed tries per segment: the expected run is finite only on paper (and past
            # e^709 not even there); the inputs describe a job that never gets through
            raise InputError(f"the run never finishes: {what} takes {seconds:.4g} s, {seconds / mtbf_s:.3g} times "
                             f"the job's mean time between failures ({mtbf_s:.4g} s), so it is interrupted about "
                             f"e^{seconds / mtbf_s:.0f} times before it completes once; lower the failure rates, "
                             f"the restart time or the checkpoint interval", field="reliability.failure_rates")
    failed = math.expm1(attempt_s / mtbf_s)  # expected failed attempts per segment
    lost = mtbf_s * failed - attempt_s
    restarts = failed * mtbf_s * math.expm1(restart_s / mtbf_s)
    wall_per_segment = mtbf_s * math.exp(restart_s / mtbf_s) * failed
    return RunTime(training_s, segments * checkpoint_s, segments * lost, segments * restarts,
                   segments * wall_per_segment / mtbf_s, interval_s)


@dataclass(frozen=True)
class GoodputReport:
    """Everything ``mpsim run --goodput`` reports."""

    tokens: float
    steps: int
    step_time_s: float
    checkpoint_bytes: float
    storage_bandwidth_bytes_per_s: float
    checkpoint_write_s: float
    checkpoint_load_s: float
    restart_time_s: float
    failures: FailureModel
    young_interval_s: float
    run: RunTime
    unit: str = "tokens"  # what ``tokens`` counts: the model's throughput unit (images, audio seconds, ...)

    @property
    def days(self) -> float:
        return self.run.wall_s / SECONDS_PER_DAY

    @property
    def interruptions_per_day(self) -> float:
        return self.failures.total_per_hour * 24.0


def checkpoint_bytes(result: SimulationResult) -> float:
    """Bytes of one checkpoint: every parameter's bf16 weight and its optimizer state, once.
    Under PyTorch's FSDP with sharded weights the weights are the optimizer's fp32 master
    weights (``parallel.zero_impl``), saved once.

    Parameters are summed over the pipeline stages and multiplied back over the groups
    that shard them (dense ones over TP, expert ones over TP and EP).
    """
    layout = result.layout
    params = sum(stage.params * layout.tp + stage.expert_params * layout.etp * layout.ep
                 for stage in result.workload.stages)
    # the state of every parameter unsharded, weights kept as the run keeps them between passes
    state = model_state_bytes(params, weight_bytes=WEIGHT_BYTES_PER_PARAM, optimizer=result.scenario.training.optimizer,
                              shard_weights=layout.weights_sharded,
                              master_is_shard=result.scenario.parallel.zero_impl == "fsdp")
    return state.weights_bytes + state.optimizer_bytes


def check_goodput_inputs(scenario, tokens: float, option: str = "--goodput") -> None:
    """What pricing a whole run needs beyond the step, checked before anything is simulated:
    the ``reliability`` fields without a default and a positive token count. ``option`` is the
    command-line option that asked for it."""
    spec = scenario.reliability
    for name in ("storage_bandwidth", "restart_time"):
        if spec is None or getattr(spec, name) is None:
            raise InputError(f"{option} needs reliability.{name} in the scenario (or --set "
                             f"reliability.{name}=...); it has no default (docs/reliability.md)",
                             field=f"reliability.{name}")
    if not tokens > 0 or not math.isfinite(tokens):
        raise InputError(f"must be a positive number of tokens, got {tokens!r}", field="--tokens")


def goodput(result: SimulationResult, tokens: float, step_time_s: float | None = None) -> GoodputReport:
    """Expected time to train ``tokens`` with the scenario's ``reliability`` block.

    ``step_time_s`` replaces the simulated step (the mean of a sampled distribution).
    Storage bandwidth and restart time have no default: missing ones are input errors.
    """
    scenario, layout = result.scenario, result.layout
    check_goodput_inputs(scenario, tokens)
    spec = scenario.reliability
    step_s = result.timeline.step_time_s if step_time_s is None else step_time_s
    # "tokens" counts in the model's throughput unit: tokens of a language model, images of a
    # ViT, audio seconds of a speech model (what its tokens/s line counts)
    unit = throughput_unit(scenario.model)
    tokens_per_step = layout.global_batch_size * unit.per_sample
    steps = math.ceil(tokens / tokens_per_step)
    size = checkpoint_bytes(result)
    bandwidth = spec.storage_bandwidth
    write_s = load_s = size / bandwidth
    hosts = math.ceil(layout.devices / scenario.cluster.system.devices_per_node)
    failures = job_failures(layout.devices, hosts, spec.failure_rates)
    mtbf = failures.mtbf_s
    interval = spec.checkpoint_interval if spec.checkpoint_interval is not None else daly_interval_s(write_s, mtbf)
    restart = spec.restart_time + load_s
    run = expected_run(steps * step_s, interval, write_s, restart, mtbf)
    return GoodputReport(tokens, steps, step_s, size, bandwidth, write_s, load_s, spec.restart_time, failures,
                         young_interval_s(write_s, mtbf), run, unit.name)
