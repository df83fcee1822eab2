"""What a worker measures, and in which order: op passes and pipeline rounds, interleaved.

The speed of a shared machine drifts over minutes (other guests of the host, clocks),
by more than the errors being measured. Nothing is therefore measured in one block:

* the op list is measured in passes, alternating direction, and an op's time is the
  median of its passes (each pass the median of the op's own repeats);
* the schedules run round-robin, one step each in turn, the first one rotating;
* and op passes and pipeline rounds alternate: pass, round, round, pass, round, ... (a
  pass every other round, :func:`op_pass_count`) so the microbenchmarks and the
  training steps they are compared with see the same minutes; every round also
  measures the split backward's cost (``mpsim/calibrate/measure/splitbench.py``) when
  the job asks for it.

The machine is checked (``mpsim/calibrate/measure/guard.py``) around each group of ops and each
training step; a disturbed one is measured again after the ranks pause together. After
a few tries an op group keeps its least disturbed measurement; a training step is
dropped instead, unless the job keeps disturbed steps (``--allow-busy``): then it too
keeps its least disturbed try, marked ``disturbed``.
Groups rather than single ops, because ``/proc/stat`` counts in 10 ms ticks, too coarse
to judge a 50 ms measurement on its own.
"""

from __future__ import annotations

import statistics

import torch

from mpsim.calibrate.measure.guard import MAX_TRIES, LoadGuard, least_disturbed

MIN_OP_PASSES = 3
OP_GROUP = 10  # ops between two checks of the machine (a check wants about a second)
OP_BUDGET_S = 0.05  # repeats of one op in one pass


def op_pass_count(steps: int) -> int:
    """Op passes in a job of ``steps`` rounds: one every other round, at least MIN_OP_PASSES.

    A pass over the op list takes several times as long as a round of training steps
    (about 18 s against 4 s for the validation job on one CPU core), and an op's time is
    the median over passes of a median over its own repeats, while an action sums dozens
    of ops: half as many passes as rounds still spreads them over the whole job.
    """
    return max(MIN_OP_PASSES, (steps + 1) // 2)


def op_pass_due(index: int, passes: int, slots: int) -> bool:
    """Whether slot ``index`` of ``slots`` starts with an op pass: ``passes`` of them, spread evenly, the first at 0."""
    return index == 0 or index * passes // slots != (index - 1) * passes // slots


class OpPasses:
    """Every op of the job, pass after pass."""

    def __init__(self, ops: list[dict], device: torch.device, kind: str, guard: LoadGuard):
        self.ops, self.device, self.kind, self.guard = ops, device, kind, guard
        self.passes: list[list] = [[] for _ in ops]
        self.done = 0

    def run_pass(self) -> None:
        from mpsim.calibrate.measure.opbench import bench_op

        order = list(range(len(self.ops)))
        if self.done % 2:
            order.reverse()
        for first in range(0, len(order), OP_GROUP):
            group = order[first:first + OP_GROUP]
            measured, disturbance = least_disturbed(
                lambda: [bench_op(self.ops[i], self.device, self.kind, budget_s=OP_BUDGET_S) for i in group],
                self.guard)
            for i, measurement in zip(group, measured):
                self.passes[i].append((measurement, disturbance))
        self.done += 1

    def results(self) -> list[dict]:
        """Per op: median of its passes, spread (the larger of within and across passes), disturbance."""
        results = []
        for passes in self.passes:
            times = sorted(m.seconds for m, _ in passes)
            median = statistics.median(times)
            within = statistics.median(m.spread for m, _ in passes)
            results.append({"seconds": median, "spread": max(within, (times[-1] - times[0]) / median),
                            "samples": sum(m.samples for m, _ in passes),
                            "foreign_cpu_share": max(d.share for _, d in passes),
                            "slowdown": max(d.slowdown for _, d in passes),
                            "canary_s": max(d.canary_s for _, d in passes)})
        return results


class SplitPasses:
    """The cost of a split backward (``mpsim/calibrate/measure/splitbench.py``), measured once per op pass."""

    def __init__(self, spec: dict, device: torch.device, kind: str, guard: LoadGuard):
        from mpsim.calibrate.measure.splitbench import SplitBackward
        from mpsim.calibrate.measure.torch_model import ModelShape

        self.bench = SplitBackward(ModelShape(**spec["shape"]), device, kind, spec.get("seed", 0))
        self.guard = guard
        self.passes: list[tuple[dict, object]] = []

    def run_pass(self) -> None:
        self.passes.append(least_disturbed(self.bench.measure, self.guard))

    def results(self) -> dict:
        """Medians over the passes of B, I, W and of the per-pass ``W / (B - I)``.

        A pass in which the full backward ran no longer than its input gradient alone is
        impossible on a steady machine and fails the job (``weight_slowdown`` says so);
        when the job keeps disturbed measurements (``--allow-busy``) such a pass is noise
        that hit ``I`` and not ``B``, and is left out (``samples`` counts the passes used).
        """
        from mpsim.calibrate.fit.fitting import weight_slowdown

        passes = self.passes
        if self.guard.keep_disturbed:
            passes = [(m, d) for m, d in passes if m["full_s"] > m["input_s"]] or passes
        ratios = [weight_slowdown(m["full_s"], m["input_s"], m["weight_s"]) for m, _ in passes]
        medians = {key: statistics.median(m[key] for m, _ in passes) for key in ("full_s", "input_s", "weight_s")}
        return {**medians, "weight_slowdown": statistics.median(ratios),
                "spread": (max(ratios) - min(ratios)) / statistics.median(ratios), "samples": len(ratios),
                "foreign_cpu_share": max(d.share for _, d in passes),
                "slowdown": max(d.slowdown for _, d in passes), "canary_s": max(d.canary_s for _, d in passes)}


class PipelineRounds:
    """Every schedule's stages built once; each round runs one step of each schedule."""

    def __init__(self, spec: dict, rank: int, device: torch.device, guard: LoadGuard, clock):
        from mpsim.calibrate.measure.pipeline import PipelineJob, PipelineRunner, torch_schedule_class
        from mpsim.calibrate.measure.torch_model import ModelShape

        self.guard = guard
        shape = ModelShape(**spec["shape"])
        self.out: dict = {}
        self.runners = {}
        for entry in spec["schedules"]:
            name = entry["name"]
            if torch_schedule_class(name) is None:
                self.out[name] = {"skipped": f"torch {torch.__version__} has no {name} schedule"}
                continue
            job = PipelineJob(name, shape, entry["layers_per_chunk"], entry["stage_to_rank"], spec["microbatches"],
                              spec["microbatch_size"], spec["seed"])
            self.runners[name] = PipelineRunner(job, rank, device, clock)
            self.out[name] = {"steps": [], "attempts": []}
            for _ in range(spec["warmup_steps"]):
                self.runners[name].step()

    def run_round(self, index: int) -> None:
        """One step of each schedule, tried again while disturbed.

        A step whose every try was disturbed is dropped, unless the job keeps disturbed
        measurements (``--allow-busy``): then its least disturbed try is kept, marked
        ``disturbed``. The ranks agree on every disturbance, hence on the choice.
        """
        names = list(self.runners)
        shift = index % max(1, len(names))
        for name in names[shift:] + names[:shift]:  # rotate who goes first
            record = self.out[name]
            best = None
            for _ in range(MAX_TRIES):
                self.guard.start()
                step = self.runners[name].step()
                disturbance = self.guard.check()
                record["attempts"].append(disturbance.as_dict())
                step.update(disturbance.as_dict())
                if not self.guard.disturbed(disturbance):
                    record["steps"].append({**step, "disturbed": False})
                    best = None
                    break
                if best is None or self.guard.score(disturbance) < best[0]:
                    best = (self.guard.score(disturbance), step)
                if not self.guard.pause_to_retry(disturbance):
                    break
            if best is not None and self.guard.keep_disturbed:
                record["steps"].append({**best[1], "disturbed": True})


def _quiet(text: str) -> None:
    """No progress report."""


def run_measurements(job: dict, rank: int, world: int, device: torch.device, kind: str, guard: LoadGuard,
                     clock, say=_quiet) -> dict:
    """The job's phases on this rank: links, then op passes and pipeline rounds interleaved, then TP.

    ``say`` gets a line at the start of every phase and of every pass or round in it
    (``mpsim/calibrate/measure/progress.py`` carries it to the user).
    """
    phases, result = job["phases"], {}
    if "links" in phases:
        from mpsim.calibrate.measure.commbench import bench_links

        repeats = job.get("links", {}).get("repeats", 15)
        say(f"links: point-to-point and collectives on {world} rank(s), {repeats} repeats per size ...")
        links, disturbance = least_disturbed(lambda: bench_links(rank, world, device, kind, repeats), guard)
        result["links"] = {**links, **disturbance.as_dict()}
    ops = OpPasses(job["ops"], device, kind, guard) if "ops" in phases else None
    split = SplitPasses(job["split"], device, kind, guard) if ops is not None and job.get("split") else None
    if "pipeline" in phases:
        names = ", ".join(entry["name"] for entry in job["pipeline"]["schedules"])
        say(f"pipeline: building the model's stages and {job['pipeline']['warmup_steps']} warm-up step(s) of "
            f"each schedule ({names}) ...")
    rounds = PipelineRounds(job["pipeline"], rank, device, guard, clock) if "pipeline" in phases else None
    steps = job["pipeline"]["steps"] if rounds is not None else 0
    slots = max(MIN_OP_PASSES if ops is not None else 0, steps)
    op_passes = op_pass_count(steps) if ops is not None else 0
    done = 0
    for index in range(slots):
        if ops is not None and op_pass_due(index, op_passes, slots):
            done += 1
            say(f"ops: pass {done} of {op_passes} over {len(ops.ops)} ops"
                + (" and the split backward" if split is not None else "") + " ...")
            ops.run_pass()
        if split is not None:
            split.run_pass()
        if rounds is not None and index < steps:
            say(f"pipeline: step {index + 1} of {steps} of {len(rounds.runners)} schedule(s) ...")
            rounds.run_round(index)
    if ops is not None:
        result["ops"] = ops.results()
    if split is not None:
        result["split_backward"] = split.results()
    if rounds is not None:
        result["pipeline"] = rounds.out
    if "tp" in phases and world >= 2:
        from mpsim.calibrate.measure.tp_check import run_tp_check

        shapes = job["tp"]["shapes"]
        result["tp"] = []
        for index, shape in enumerate(shapes):
            config = {**job["tp"], **shape}
            say(f"TP check: shape {index + 1} of {len(shapes)} (hidden {shape['hidden']}, FFN {shape['ffn_hidden']}), "
                f"TP=1 against TP={world} ...")
            tp, disturbance = least_disturbed(lambda: run_tp_check(config, rank, world, device, kind), guard)
            result["tp"].append({**tp, **shape, **disturbance.as_dict()})
    say("done; collecting the results")
    return result
