"""What a calibration or validation job measures, as the JSON the workers read.

Both commands run a validation job: the compute ops (both attention paths), a sweep of
square GEMMs for the efficiency curve, the links, and the real training job, the
validation scenario under each schedule (its placement of stages on ranks comes from
mpsim's own schedule, which reproduces PyTorch's order). ``mpsim calibrate`` runs only
the fit schedule, and adds the ops of the scenario it calibrates for; ``mpsim validate``
runs every schedule and the MLP check at TP = 1 and TP = ranks, at several widths. The
ops are measured in the same job as the training steps, interleaved with them, so the
fit and the check see the same machine.
The validation job also measures what splitting a layer's backward into input and
weight gradients costs in PyTorch (``mpsim/calibrate/measure/splitbench.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mpsim.calibrate.measure.machine import FOREIGN_CPU_LIMIT
from mpsim.calibrate.measure.ops import scenario_ops, sweep_ops
from mpsim.engine import rank_spans
from mpsim.errors import InputError
from mpsim.resolve import resolve
from mpsim.schedules import SCHEDULES, ScheduleError, build_schedule, canonical_name, unknown_schedule
from mpsim.specs import load_scenario
from mpsim.specs.scenario import Scenario
from mpsim.workload.embedding import padded_vocab

DEFAULT_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zbv", "dualpipev")
FIT_SCHEDULE = "1f1b"
VALIDATION_SCENARIO = "validation-2xcpu"
TP_CHECK_SEQUENCES = 8  # sequences per MLP call in the TP check: 1024 tokens, so the all-reduces are a small part
# The TP check runs the MLP block at several widths, the model's own and scaled by these
# factors (hidden and FFN alike): a prediction right at one shape can be right by luck,
# and on a CPU the share of the all-reduces and of the framework's fixed costs changes
# with the width. 0.5 and 1.5 keep the largest block a few seconds on one core.
TP_CHECK_WIDTH_SCALES = (0.5, 1.0, 1.5)


@dataclass
class MeasureSettings:
    """How long and how carefully to measure."""

    warmup_steps: int = 1
    steps: int = 3
    link_repeats: int = 15
    tp_repeats: int = 15
    foreign_limit: float = FOREIGN_CPU_LIMIT
    group_timeout_s: float = 120.0  # a send without its receive fails after this long
    wait_budget_s: float = 300.0  # how long the job may pause, in all, for a busy machine to quiet down
    seed: int = 0
    # --allow-busy: a training step none of whose tries was quiet keeps its least disturbed
    # try (marked) instead of being dropped, and once wait_budget_s is spent a disturbed
    # measurement is not tried again
    keep_disturbed: bool = False


@dataclass
class ValidationPlan:
    """The scenarios behind one validation job."""

    path: Path
    base: Scenario
    schedules: list[str]
    variants: dict[str, Scenario] = field(default_factory=dict)  # per schedule
    unavailable: dict[str, str] = field(default_factory=dict)  # schedule -> why mpsim cannot plan it
    # the TP check: per MLP width, the scenario at TP = 1 and at TP = ranks (the model's own width first)
    tp_pairs: list[tuple[Scenario, Scenario]] = field(default_factory=list)


def schedule_variant(path: Path, name: str, overrides: list[str]) -> Scenario:
    """The scenario at ``path`` under schedule ``name`` with the chunks per rank it needs."""
    kind = SCHEDULES[name]
    vpp = max(1, kind.min_vpp)
    return load_scenario(path, [*overrides, f"parallel.schedule={name}", f"parallel.vpp={vpp}"]).scenario


def validation_plan(path: Path, schedules: list[str], ranks: int, overrides: list[str] | None = None
                    ) -> ValidationPlan:
    """Scenario variants for each schedule on ``ranks`` pipeline ranks, and the TP check's."""
    overrides = list(overrides or [])
    sized = [*overrides, f"parallel.pp={ranks}", f"cluster.num_devices={ranks}"]
    base = load_scenario(path, sized).scenario
    plan = ValidationPlan(path, base, [])
    for raw in schedules:
        name = canonical_name(raw)
        problem = unknown_schedule(raw)
        if problem:
            raise InputError(problem, "--schedules")
        try:
            variant = schedule_variant(path, name, sized)
            layout = resolve(variant)
            build_schedule(name, layout.pp, layout.vpp, layout.num_microbatches, check=True, timer=rank_spans)
        except (InputError, ScheduleError) as exc:
            plan.unavailable[name] = str(exc)
            continue
        plan.schedules.append(name)
        plan.variants[name] = variant
    if ranks >= 2:
        tp = [*overrides, "parallel.pp=1", "parallel.vpp=1", "parallel.schedule=1f1b",
              f"parallel.microbatch_size={TP_CHECK_SEQUENCES}", f"parallel.global_batch_size={TP_CHECK_SEQUENCES}",
              "training.tp_comm_overlap_backward=false"]
        for hidden, ffn in tp_check_widths(base, ranks):
            width = [*tp, f"model.hidden_size={hidden}", f"model.ffn_hidden_size={ffn}"]
            plan.tp_pairs.append((load_scenario(path, [*width, "parallel.tp=1", "cluster.num_devices=1"]).scenario,
                                  load_scenario(path, [*width, f"parallel.tp={ranks}",
                                                       f"cluster.num_devices={ranks}"]).scenario))
    return plan


def tp_check_widths(base: Scenario, ranks: int) -> list[tuple[int, int]]:
    """(hidden, FFN hidden) of each MLP block the TP check runs: the model's own first, then scaled ones.

    A scaled width is rounded to a multiple of the model's heads times ``ranks`` (so
    heads and the TP split divide it); a scale that rounds onto a width already
    listed is left out.
    """
    model = base.model
    step = model.num_attention_heads * ranks
    widths = [(model.hidden_size, model.ffn_hidden_size)]
    for scale in TP_CHECK_WIDTH_SCALES:
        hidden = max(step, round(model.hidden_size * scale / step) * step)
        ffn = max(ranks, round(model.ffn_hidden_size * hidden / model.hidden_size / ranks) * ranks)
        if (hidden, ffn) not in widths:
            widths.append((hidden, ffn))
    return widths


def _record_key(record: dict) -> tuple:
    if record["kind"] == "gemm":
        return ("gemm", tuple(record["shape"]), record["layout"])
    if record["kind"] == "attention":
        return ("attention", record["direction"], round(record["flops"]), record.get("fused", True))
    return ("memory", record["name"], round(record["bytes"]))


def measured_ops(scenarios: list[Scenario], dtype: str) -> list[dict]:
    """Every distinct op of the scenarios, the unfused attention core beside each fused one, the GEMM sweep."""
    seen: dict[tuple, dict] = {}
    for index, scenario in enumerate(scenarios):
        for record in scenario_ops(scenario, both_attention_paths=index == 0):
            seen.setdefault(_record_key(record), record)
            if record["kind"] == "attention":
                unfused = {**record, "fused": False}
                seen.setdefault(_record_key(unfused), unfused)
    for record in sweep_ops(dtype):
        seen.setdefault(_record_key(record), record)
    return list(seen.values())


def model_shape(scenario: Scenario) -> dict:
    """The PyTorch model's shape (``mpsim.calibrate.measure.torch_model.ModelShape``) for a scenario's model."""
    model = scenario.model
    if model.kv_heads != model.num_attention_heads or model.gated_ffn or model.position_embedding != "learned":
        raise InputError("the validation model must be a GPT-style transformer (no GQA, GELU MLP, learned "
                         "positions) for the PyTorch job to run the same ops", "model")
    return {"layers": model.num_layers, "hidden": model.hidden_size, "heads": model.num_attention_heads,
            "ffn_hidden": model.ffn_hidden_size, "vocab": padded_vocab(model.vocab_size, 1),
            "seq_length": model.seq_length, "norm": model.norm,
            "flash_attention": scenario.training.attention == "flash", "bias": model.linear_bias,
            "dtype": scenario.training.dtype}


def validation_job(plan: ValidationPlan, device: str, settings: MeasureSettings,
                   also_measure: tuple[Scenario, ...] = ()) -> dict:
    """Ops, links, the pipeline schedules and the TP check of a validation plan.

    ``also_measure``: scenarios whose ops the job measures too (``mpsim calibrate``'s
    own scenario, whose profile the fit on the plan's schedule then completes).
    """
    base = plan.base
    tp_scenarios = [s for pair in plan.tp_pairs for s in pair]
    ops = measured_ops([*also_measure, base, *plan.variants.values(), *tp_scenarios], base.training.dtype)
    entries = []
    for name, variant in plan.variants.items():
        layout = resolve(variant)
        schedule = build_schedule(name, layout.pp, layout.vpp, layout.num_microbatches, timer=rank_spans)
        entries.append({"name": name, "stage_to_rank": list(schedule.stage_to_rank),
                        "layers_per_chunk": list(layout.layers_per_chunk)})
    layout = resolve(base)
    shape = model_shape(base)
    job = {"device": device, "timeout_s": settings.group_timeout_s, "foreign_limit": settings.foreign_limit,
           "wait_budget_s": settings.wait_budget_s, "keep_disturbed": settings.keep_disturbed,
           "phases": ["ops", "links", "pipeline"], "ops": ops,
           "links": {"repeats": settings.link_repeats}, "split": {"shape": shape, "seed": settings.seed},
           "pipeline": {"shape": shape, "microbatches": layout.num_microbatches,
                        "microbatch_size": layout.microbatch_size, "warmup_steps": settings.warmup_steps,
                        "steps": settings.steps, "seed": settings.seed, "schedules": entries}}
    if plan.tp_pairs:
        model = base.model
        job["phases"].append("tp")
        job["tp"] = {"shapes": [{"hidden": single.model.hidden_size, "ffn_hidden": single.model.ffn_hidden_size}
                                for single, _ in plan.tp_pairs],
                     "bias": model.linear_bias, "batch": TP_CHECK_SEQUENCES, "seq": model.seq_length,
                     "repeats": settings.tp_repeats, "warmup": 3, "seed": settings.seed, "dtype": base.training.dtype}
    return job
