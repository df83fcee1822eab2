"""How fast ``mpsim plan`` is, and whether its answer is the one an exhaustive run gives.

(a) GPT-3 175B on 1,024 A100 (128 DGX A100 nodes), sequence 2,048, global batch 1,536,
    the setup of Narayanan et al. 2021: the whole plan (every layout checked, the fitting
    ones bounded, simulated in bound order) on all local cores. Target: 60 s on two
    cores; Calculon's anchor is about 600 layouts per second per core, without a timeline.
(b) ``--check``: the exhaustive run: every layout that fits in memory simulated with the
    SimPy engine (no dominance, no bound, no fast path), and where the plan's best layout
    lands in that ranking.
(c) ``--llama``: Llama 3 405B on 16,384 H100 at 8K sequence, global batch 2,048 (the
    Llama 3 paper's pre-training setup): where TP 8, PP 16, DP 128 lands, and why.

The last line is ``plan_s=<x> configs=<n> configs_per_s=<y>``, where a config is a layout
the plan evaluated (every enumerated layout gets at least the memory check).
"""

from __future__ import annotations

import argparse
import resource
import time

from mpsim.explore.layouts import RECOMPUTE_ORDER
from mpsim.explore.planbase import base_scenario
from mpsim.explore.planner import PlanEvaluator, layout_label, plan, plan_identity
from mpsim.explore.planreport import format_plan, loss_reason, matching, ranked
from mpsim.explore.pools import Session
from mpsim.explore.runner import RunControl, run_points
from mpsim.explore.store import canonical_json


def cpu_s() -> float:
    """CPU seconds of this process and its finished worker processes."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def gpt3(workers: int | None) -> tuple:
    scenario = base_scenario("gpt3-175b", "dgx-a100", 1024, 1536, 2048)
    start, cpu = time.perf_counter(), cpu_s()
    result = plan(scenario, top=10, workers=workers, progress=False)
    seconds, used = time.perf_counter() - start, cpu_s() - cpu
    print(format_plan(result, 10))
    print(f"\n(a) {len(result.points)} layouts in {seconds:.1f} s wall, {used:.1f} s CPU on {result.workers} workers "
          f"({len(result.points) / used:.0f} layouts per CPU-second); {result.simulated} simulated")
    return scenario, result, seconds


def exhaustive(scenario, result, workers: int | None) -> None:
    """Every layout that fits, simulated by the SimPy engine; where does the plan's #1 land?"""
    start = time.perf_counter()
    evaluator = PlanEvaluator(scenario, "simulate", "simpy", plan_identity(scenario))
    with Session(workers=workers) as session:
        report = run_points(evaluator, result.points, session, RunControl(progress=False, label="exhaustive"))
    everything = sorted((r for r in report.records if r["status"] == "ok"),
                        key=lambda r: (r["metrics"]["step_time_s"], r["metrics"]["peak_memory_bytes"]))
    best = ranked(result)[0]
    position = next(i for i, r in enumerate(everything) if r["key"] == best["key"]) + 1
    print(f"\n(b) exhaustive SimPy run: {len(everything)} layouts simulated in {time.perf_counter() - start:.0f} s; "
          f"the plan's #1 ({layout_label(best['point'])}, {best['metrics']['step_time_s']:.4f} s) is "
          f"#{position} there; the exhaustive #1 is {layout_label(everything[0]['point'])} at "
          f"{everything[0]['metrics']['step_time_s']:.4f} s")
    # the plan drops a layout when the same layout with less recompute fits (never slower);
    # the exhaustive run keeps them, so compare after dropping those twins
    fitting = {canonical_json({k: v for k, v in r["point"].items() if k != "parallel.recompute"})
               + str(r["point"].get("parallel.recompute")) for r in everything}

    def twin_fits(record: dict) -> bool:
        mode = record["point"].get("parallel.recompute")
        rest = canonical_json({k: v for k, v in record["point"].items() if k != "parallel.recompute"})
        return any(rest + lighter in fitting for lighter in RECOMPUTE_ORDER[:RECOMPUTE_ORDER.index(mode)])

    undominated = [r for r in everything if not twin_fits(r)]
    top_plan = [r["key"] for r in ranked(result)[:10]]
    print(f"    exhaustive top 10: {sum(twin_fits(r) for r in everything[:10])} of them have a lighter-recompute "
          f"twin that fits; without those, the plan's top 10 "
          f"{'equals' if top_plan == [r['key'] for r in undominated[:10]] else 'differs from'} the exhaustive one")


def llama(workers: int | None) -> None:
    scenario = base_scenario("llama3-405b", "dgx-h100", 16384, 2048, 8192)
    start = time.perf_counter()
    result = plan(scenario, top=10, workers=workers, progress=False)
    print(f"\n(c) {format_plan(result, 10)}")
    print(f"    ({time.perf_counter() - start:.1f} s)")
    winners = ranked(result)
    found = matching(result, {"tp": 8, "pp": 16, "dp": 128})
    print(f"\n    where tp=8 pp=16 dp=128 landed ({len(found)} layouts):")
    for where, record in found[:12]:
        print(f"      {layout_label(record['point'])}: {where}")
    if winners and found:
        best_paper = found[0][1]
        if best_paper["status"] == "ok":
            m, b = best_paper["metrics"], winners[0]["metrics"]
            print(f"    its best is {100 * (m['step_time_s'] / b['step_time_s'] - 1):.1f} % slower than #1; "
                  f"{loss_reason(best_paper, winners[0])[1] if best_paper is not winners[0] else 'it is #1'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, help="worker processes (default: all local cores)")
    parser.add_argument("--check", action="store_true", help="also run the exhaustive SimPy comparison (minutes)")
    parser.add_argument("--llama", action="store_true", help="also plan Llama 3 405B on 16,384 H100")
    args = parser.parse_args()
    scenario, result, seconds = gpt3(args.workers)
    if args.check:
        exhaustive(scenario, result, args.workers)
    if args.llama:
        llama(args.workers)
    configs = len(result.points)
    print(f"plan_s={seconds:.2f} configs={configs} configs_per_s={configs / seconds:.0f}")


if __name__ == "__main__":
    main()
