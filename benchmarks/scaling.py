"""How the cost of simulating a step grows with the work: microbatches and pipeline stages.

The Megatron 1T layout of ``scenarios/megatron_1t_3072xa100.yaml`` (TP 8 on 3,072 A100,
1F1B) with links not shared (``training.network_contention=false``, the inputs the
longest path models), at 64, 256, 1,024 and 4,096 microbatches per pipeline with 64
stages, and at 16, 32, 64 and 128 stages with 256 microbatches (DP follows from the
device count). For each, the engine input is built once and timed through

* the SimPy engine (``mpsim.engine.simulate``), once: it is the slow one; and the same
  engine with the step's exactly repeated middle run once and put back
  (``mpsim.engine.excise.simulate_excised``, what ``mpsim run`` uses; the ``cut s`` column);
* the fast path (``mpsim.engine.simulate_steady``: the longest path with the repeated
  middle skipped where it repeats exactly): the first call, which also plans the
  schedule and finds its repeated structure (both cached per schedule), and the best
  of five calls after it.

* the compiled longest path (``mpsim.engine.simulate_compiled``, numba): best of five
  calls after a first one, with its per-action records (what the planner's summaries
  read; every item evaluated) and without them (the step time, rank ends and syncs:
  what an analytical tool gives; the repeated periods jumped over where exact, as the
  steady walk does, ``mpsim/engine/compiled_steady.py``). The ``skipped`` columns count
  the items each of the two skipping evaluators left out.

Each step time is checked against the engine's (1e-9 relative). The fast path of a row is
the faster of the steady walk and the compiled loop without records. The last line is
``m4096_over_m64=<r> fast_1t_3072_ms=<t> engine_over_fast=<e>``: the fast path's time at
4,096 microbatches over its time at 64, its time for the 1T layout itself (64 stages, 64
microbatches) in milliseconds, and the engine's time over the fast path's there. The
line before it gives the same ratio for each evaluator alone, and the one before that times
the engine over the 1T step at 4,096 microbatches as the scenario runs it, links shared.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mpsim.engine import EngineInput, Timeline, simulate as engine_simulate, simulate_compiled, simulate_steady
from mpsim.engine.compiled import available
from mpsim.engine.excise import simulate_excised
from mpsim.simulate import simulate
from mpsim.specs import load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "megatron_1t_3072xa100.yaml"
DEVICES_PER_TP_GROUP = 3072 // 8
REPEATS = 5


def engine_input(pp: int, microbatches: int, contention: bool = False) -> EngineInput:
    """The 1T layout's engine input with ``pp`` stages and ``microbatches`` per pipeline."""
    dp = DEVICES_PER_TP_GROUP // pp
    scenario = load_scenario(SCENARIO, [f"training.network_contention={str(contention).lower()}", f"parallel.pp={pp}",
                                        f"parallel.dp={dp}", f"parallel.global_batch_size={dp * microbatches}"]
                             ).scenario
    captured: list[EngineInput] = []

    def capture(inp: EngineInput) -> Timeline:
        captured.append(inp)
        return Timeline(inp.schedule.num_ranks)

    simulate(scenario, engine=capture)
    return captured[0]


def measure(pp: int, microbatches: int, with_engine: bool) -> dict[str, float]:
    inp = engine_input(pp, microbatches)
    start = time.perf_counter()
    first = simulate_steady(inp)
    cold = time.perf_counter() - start
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fast = simulate_steady(inp)
        best = min(best, time.perf_counter() - start)
    assert fast.step_time_s == first.step_time_s
    compiled, timelines = {}, {"steady": fast}
    for records in (True, False):
        simulate_compiled(inp, records=records)
        compiled[records] = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            timeline = simulate_compiled(inp, records=records)
            compiled[records] = min(compiled[records], time.perf_counter() - start)
        timelines["compiled" if records else "compiled without records"] = timeline
    row = {"pp": pp, "m": microbatches, "actions": sum(len(a) for a in inp.schedule.actions), "fast_cold_s": cold,
           "steady_s": best, "compiled_records_s": compiled[True], "compiled_s": compiled[False],
           "fast_s": min(best, compiled[False]), "skipped": fast.skipped_items,
           "compiled_skipped": timeline.skipped_items, "step_s": fast.step_time_s, "engine_s": float("nan"),
           "engine_cut_s": float("nan")}
    reference = fast
    if with_engine:
        start = time.perf_counter()
        reference = engine_simulate(inp)
        row["engine_s"] = time.perf_counter() - start
        start = time.perf_counter()
        timelines["engine with its middle cut"] = simulate_excised(inp)
        row["engine_cut_s"] = time.perf_counter() - start
    for name, timeline in timelines.items():
        relative = abs(timeline.step_time_s - reference.step_time_s) / reference.step_time_s
        assert relative <= 1e-9, f"pp {pp}, m {microbatches}: {name} {timeline.step_time_s} " \
                                 f"{'engine' if with_engine else 'steady'} {reference.step_time_s}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-engine", action="store_true", help="time the fast path only (the engine takes minutes)")
    args = parser.parse_args()
    if not available():
        parser.error("the compiled evaluator needs numba: pip install 'mpsim[fast]'")
    contended = None
    if not args.no_engine:
        # first, while the process is fresh (a heap that has held millions of records slows the
        # next million): the 1T step as its scenario runs it, links shared, where DP buckets share
        # the NICs with pipeline sends in the cool-down and only the event engine prices it
        inp = engine_input(64, 4096, contention=True)
        seconds, steps = [], []
        for evaluate in (engine_simulate, simulate_excised):  # one million records alive at a time
            start = time.perf_counter()
            steps.append(evaluate(inp).step_time_s)
            seconds.append(time.perf_counter() - start)
        assert abs(steps[1] - steps[0]) <= 1e-9 * steps[0]
        contended = (f"with contention, pp 64, m 4096: engine {seconds[0]:.3f} s, with its middle cut "
                     f"{seconds[1]:.3f} s, step {steps[0]:.4f} s")
    rows = []
    print(f"{'pp':>4} {'m/pipe':>7} {'actions':>9} {'engine s':>9} {'cut s':>7} {'steady 1st s':>12} {'steady s':>9} "
          f"{'skipped':>9} {'compiled s':>10} {'no records s':>12} {'skipped':>9} {'engine/fast':>11}  step s")
    for pp, micro in [(64, 64), (64, 256), (64, 1024), (64, 4096), (16, 256), (32, 256), (128, 256)]:
        row = measure(pp, micro, not args.no_engine)
        rows.append(row)
        print(f"{pp:>4} {micro:>7} {row['actions']:>9} {row['engine_s']:>9.3f} {row['engine_cut_s']:>7.3f} "
              f"{row['fast_cold_s']:>12.3f} "
              f"{row['steady_s']:>9.4f} {row['skipped']:>9} {row['compiled_records_s']:>10.5f} "
              f"{row['compiled_s']:>12.5f} {row['compiled_skipped']:>9} {row['engine_s'] / row['fast_s']:>11.1f}  "
              f"{row['step_s']:.4f}", flush=True)
    if contended:
        print(contended)
    by = {(r["pp"], r["m"]): r for r in rows}
    base = by[(64, 64)]
    names = ("steady_s", "compiled_records_s", "compiled_s") + (() if args.no_engine else ("engine_s", "engine_cut_s"))
    ratios = {name: by[(64, 4096)][name] / base[name] for name in names}
    print("m4096_over_m64 by evaluator: " + " ".join(f"{name[:-2]}={r:.2f}" for name, r in ratios.items()))
    ratio = by[(64, 4096)]["fast_s"] / base["fast_s"]
    print(f"m4096_over_m64={ratio:.2f} fast_1t_3072_ms={1e3 * base['fast_s']:.2f} "
          f"engine_over_fast={base['engine_s'] / base['fast_s']:.1f}")


if __name__ == "__main__":
    main()
