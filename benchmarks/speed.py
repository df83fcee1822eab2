"""Wall time to simulate two large jobs on one core.

(a) Megatron 1T on 3,072 A100 (TP 8, PP 64, DP 6, 64 microbatches per pipeline), and
(b) Llama 3 405B on 16,384 H100 (TP 8, PP 16, DP 128, interleaved). Each is timed from a
loaded scenario to a finished timeline, best of ten runs: the first also pays for
imports and caches, and the machine's other load only ever adds time, so the minimum is
the figure that repeats. Targets: (a) <= 0.1 s, (b) <= 1 s. The last line is
``megatron_1t_3072_s=<a> llama3_405b_16384_s=<b>``.
"""

from __future__ import annotations

import time
from pathlib import Path

from mpsim.results import summarize
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.workload.stages import build_stage

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
REPEATS = 10


def best_time(name: str) -> tuple[float, int, float]:
    """(best wall seconds, actions simulated, simulated step seconds)."""
    scenario = load_scenario(SCENARIOS / name).scenario
    best = float("inf")
    for _ in range(REPEATS):
        build_stage.cache_clear()  # time the whole path, workload included
        start = time.perf_counter()
        result = simulate(scenario)
        best = min(best, time.perf_counter() - start)
    actions = sum(len(a) for a in result.schedule.actions)
    return best, actions, result.timeline.step_time_s


def main() -> None:
    a, actions_a, step_a = best_time("megatron_1t_3072xa100.yaml")
    print(f"(a) Megatron 1T, 3,072 A100: {a:.3f} s wall for {actions_a} actions ({1e6 * a / actions_a:.1f} us each); "
          f"simulated step {step_a:.2f} s")
    b, actions_b, step_b = best_time("llama3_405b_16384xh100.yaml")
    print(f"(b) Llama 3 405B, 16,384 H100: {b:.3f} s wall for {actions_b} actions ({1e6 * b / actions_b:.1f} us each); "
          f"simulated step {step_b:.2f} s")
    start = time.perf_counter()
    summarize(simulate(load_scenario(SCENARIOS / "megatron_1t_3072xa100.yaml").scenario))
    print(f"(a) with metrics and memory report: {time.perf_counter() - start:.3f} s")
    print(f"megatron_1t_3072_s={a:.3f} llama3_405b_16384_s={b:.3f}")


if __name__ == "__main__":
    main()
