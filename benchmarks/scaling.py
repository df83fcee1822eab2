"""How the cost of simulating a step grows with the work: microbatches and pipeline stages.

The Megatron 1T layout of ``scenarios/megatron_1t_3072xa100.yaml`` (TP 8 on 3,072 A100,
1F1B) with links not shared (``training.network_contention=false``, the inputs the
longest path models), at 64, 256, 1,024 and 4,096 microbatches per pipeline with 64
stages, and at 16, 32, 64 and 128 stages with 256 microbatches (DP follows from the
device count). For each, the engine input is built once and timed through

* the SimPy engine (``mpsim.engine.simulate``), once: it is the slow one;
* the fast path (``mpsim.engine.simulate_steady``: the longest path with the repeated
  middle skipped where it repeats exactly): the first call, which also plans the
  schedule and finds its repeated structure (both cached per schedule), and the best
  of five calls after it.

Each step time is checked against the engine's (1e-9 relative). The last line is
``m4096_over_m64=<r> fast_1t_3072_ms=<t> engine_over_fast=<e>``: the fast path's time at
4,096 microbatches over its time at 64, its time for the 1T layout itself (64 stages, 64
microbatches) in milliseconds, and the engine's time over the fast path's there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mpsim.engine import EngineInput, Timeline, simulate as engine_simulate, simulate_steady
from mpsim.simulate import simulate
from mpsim.specs import load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "megatron_1t_3072xa100.yaml"
DEVICES_PER_TP_GROUP = 3072 // 8
REPEATS = 5


def engine_input(pp: int, microbatches: int) -> EngineInput:
    """The 1T layout's engine input with ``pp`` stages and ``microbatches`` per pipeline."""
    dp = DEVICES_PER_TP_GROUP // pp
    scenario = load_scenario(SCENARIO, ["training.network_contention=false", f"parallel.pp={pp}",
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
    row = {"pp": pp, "m": microbatches, "actions": sum(len(a) for a in inp.schedule.actions), "fast_cold_s": cold,
           "fast_s": best, "skipped": fast.skipped_items, "step_s": fast.step_time_s, "engine_s": float("nan")}
    if with_engine:
        start = time.perf_counter()
        engine = engine_simulate(inp)
        row["engine_s"] = time.perf_counter() - start
        relative = abs(engine.step_time_s - fast.step_time_s) / engine.step_time_s
        assert relative <= 1e-9, f"pp {pp}, m {microbatches}: fast {fast.step_time_s} engine {engine.step_time_s}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-engine", action="store_true", help="time the fast path only (the engine takes minutes)")
    args = parser.parse_args()
    rows = []
    print(f"{'pp':>4} {'m/pipe':>7} {'actions':>9} {'engine s':>9} {'fast 1st s':>10} {'fast s':>8} "
          f"{'skipped':>9} {'engine/fast':>11}  step s")
    for pp, micro in [(64, 64), (64, 256), (64, 1024), (64, 4096), (16, 256), (32, 256), (128, 256)]:
        row = measure(pp, micro, not args.no_engine)
        rows.append(row)
        print(f"{pp:>4} {micro:>7} {row['actions']:>9} {row['engine_s']:>9.3f} {row['fast_cold_s']:>10.3f} "
              f"{row['fast_s']:>8.4f} {row['skipped']:>9} {row['engine_s'] / row['fast_s']:>11.1f}  "
              f"{row['step_s']:.4f}", flush=True)
    by = {(r["pp"], r["m"]): r for r in rows}
    base = by[(64, 64)]
    ratio = by[(64, 4096)]["fast_s"] / base["fast_s"]
    print(f"m4096_over_m64={ratio:.2f} fast_1t_3072_ms={1e3 * base['fast_s']:.1f} "
          f"engine_over_fast={base['engine_s'] / base['fast_s']:.1f}")


if __name__ == "__main__":
    main()
