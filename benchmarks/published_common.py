"""What every table of ``benchmarks/validate_published.py`` shares: rows, predictions, pricing.

A published row becomes a :class:`Case` (what was measured and a function that predicts
it); running it gives a :class:`Result`. The tables' builders live beside this module
(``validate_published.py`` for Korthikanti et al. and NVIDIA's DGX Cloud recipes,
``published_zero_bubble.py`` for the Zero Bubble paper) and price their rows with the two
helpers here: a whole step through the public loader and simulator
(:func:`simulate_step`), or one stage's passes through the cost model alone
(:func:`middle_stage`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from mpsim.cost.actions import CostModel
from mpsim.resolve import resolve
from mpsim.results import summarize
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario
from mpsim.workload.embedding import padded_vocab
from mpsim.workload.stages import build_stage, layer_context, stage_options

ROOT = Path(__file__).resolve().parent.parent
# copies of the published tables (each row names its source in its first column), so the
# harness and its test run on a bare clone
DATA = Path(__file__).resolve().parent / "data"
SCENARIOS = ROOT / "scenarios"


def number(text: str) -> int:
    """An integer the CSV prints as '4.0' or '4'."""
    return int(float(text))



@dataclass
class Prediction:
    value: float  # the quantity the source printed, in the table's unit
    breakdown: dict[str, float]  # compute, bubble, tp, cp, pp, dp, optimizer (seconds, or the table's unit)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Case:
    """One published row: what was measured, how to predict it, and its gaps."""

    table: str
    label: str
    measured: float
    predict: Callable[[], Prediction]
    notes: tuple[str, ...] = ()
    quick: bool = False


@dataclass
class Result:
    table: str
    label: str
    measured: float
    predicted: float | None
    error_pct: float | None
    breakdown: dict[str, float]
    extra: dict[str, float]
    notes: tuple[str, ...]
    failure: str | None = None


@dataclass(frozen=True)
class Table:
    title: str
    quantity: str  # what measured / predicted are
    unit: str  # of measured / predicted
    breakdown_unit: str
    build: Callable[[Path], list[Case]]
    extra_columns: tuple[tuple[str, str], ...] = ()  # (header, key of Prediction.extra)
    assumptions: tuple[str, ...] = ()  # fields the source left out, printed under the table
    # a rate (samples per second), where more is faster: its error's sign is turned so that +
    # means slower than the run in every table, as it does for a time
    higher_is_faster: bool = False


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def step_breakdown(summary) -> dict[str, float]:
    """Where the step went, in seconds (means over pipeline ranks, from the Summary)."""
    ranks = summary.ranks
    inside = sum(r.compute_s - r.tp_comm_exposed_s - r.cp_comm_exposed_s - r.ep_comm_exposed_s
                 - r.zero_gather_exposed_s - r.amax_exposed_s for r in ranks) / len(ranks)
    # a step that overlaps its neighbours (optimizer post-validation) hides part of its fill and drain
    bubble = summary.bubble_s - summary.bubble_comm_s - summary.cross_step_overlap_s
    return {"compute": inside, "bubble": bubble,
            "tp": summary.exposed_tp_comm_s, "cp": summary.exposed_cp_comm_s, "pp": summary.exposed_pp_comm_s,
            "dp": summary.exposed_dp_comm_s, "optimizer": summary.optimizer_s}


def print_error_rows(title: str, rows: list[tuple[str, float, float]], unit: str) -> None:
    """Rows of (label, measured, predicted) in ``unit``, each with its error, then the line
    ``rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>`` (+: the prediction is slower)."""
    width = max([len(label) for label, _, _ in rows] + [len(title)])
    print(f"{title:<{width}} {'measured':>11} {'predicted':>11} {'error':>7}")
    errors = []
    for label, measured, predicted in rows:
        error = 100.0 * (predicted / measured - 1.0)
        errors.append(error)
        print(f"{label:<{width}} {measured:8.3f} {unit:2s} {predicted:8.3f} {unit:2s} {error:+6.1f}%")
    print(f"rows={len(errors)} mean_abs_error_pct={sum(map(abs, errors)) / len(errors):.2f} "
          f"mean_signed_error_pct={sum(errors) / len(errors):.2f}")


def job_overrides(system: str, model: str, seq: int, gpus: int, microbatch: int, global_batch: int,
                  **sizes: int) -> list[str]:
    """The settings of a published row's job: its system first (later settings edit it), the model
    at the row's sequence, the GPUs filling the system's nodes in order (an NVL72 rack holds 72),
    the parallel sizes (``tp=2, pp=8, ...``) and Megatron's schedule for them, and the batch."""
    vpp = sizes.get("vpp", 1)
    return [f"cluster.system={system}", f"model={model}", f"model.seq_length={seq}", "cluster.nodes=null",
            f"cluster.num_devices={gpus}", *(f"parallel.{name}={size}" for name, size in sizes.items()),
            f"parallel.schedule={'interleaved-1f1b' if vpp > 1 else '1f1b'}",
            f"parallel.microbatch_size={microbatch}", f"parallel.global_batch_size={global_batch}"]


# ``validate_published.py --set FIELD=VALUE``: applied to every row after its own settings, to
# ask a table what-if questions (a setting off, another system); empty for the published check
WHAT_IF: list[str] = []


def simulate_step(base: Path, overrides: list[str]):
    """Load, simulate and summarize one scenario (with the reference run that splits the bubble)."""
    scenario = load_scenario(base, [*overrides, *WHAT_IF]).scenario
    result = simulate(scenario)
    return summarize(result, bubble_reference(result))


def predicted_step(base: Path, overrides: list[str]) -> Prediction:
    """The step time of ``base`` with ``overrides``, and where it went."""
    summary = simulate_step(base, overrides)
    return Prediction(summary.step_time_s, step_breakdown(summary))


def step_prediction(base: Path, overrides: list[str]) -> Callable[[], Prediction]:
    """A row's prediction, :func:`predicted_step` of its scenario (``.args``: the base and overrides)."""
    return partial(predicted_step, base, overrides)


def middle_stage(base: Path, overrides: list[str], layers: int):
    """The work of a pipeline stage of ``layers`` transformer layers (no embedding, no head) on
    one rank, and the cost model that prices it, as auto balancing builds them."""
    scenario = load_scenario(base, [*overrides, *WHAT_IF]).scenario
    layout = resolve(scenario)
    ctx = layer_context(scenario, layout)
    options = stage_options(scenario, layout, padded_vocab(scenario.model.vocab_size, layout.tp))
    return build_stage(ctx, layers, layers, False, False, options), CostModel(scenario, layout)
