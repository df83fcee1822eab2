"""How long the PNG timeline of the largest shipped pipeline takes to draw, and how tall it is.

Megatron GPT 1T on 3,072 A100 (``scenarios/megatron_1t_3072xa100.yaml``): 64 pipeline
stages, 64 microbatches, 8,192 actions. The step is simulated first (not timed); the
time is ``plot_timeline`` alone, matplotlib's ``savefig`` included. Target: 1 s. Run it
on a quiet machine: the drawing is single-threaded and a busy core doubles the time.

The last line is ``png_s=<seconds>``; the one before names the scenario and the height.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from matplotlib import image

from mpsim.results import summarize
from mpsim.results.plot import plot_timeline
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "megatron_1t_3072xa100.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(SCENARIO), help="scenario file (default: Megatron 1T on 3,072 A100)")
    parser.add_argument("--repeats", type=int, default=3, help="drawings to time; the fastest is reported")
    args = parser.parse_args()
    loaded = load_scenario(args.scenario, [])
    result = simulate(loaded.scenario, loaded.path.parent)
    reference = bubble_reference(result)
    summary = summarize(result, reference)
    best_s = float("inf")
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "timeline.png")
        for _ in range(max(1, args.repeats)):
            start = time.perf_counter()
            plot_timeline(result, summary, path, reference=reference)
            best_s = min(best_s, time.perf_counter() - start)
        height_px = image.imread(path).shape[0]
    print(f"{summary.scenario}: {result.timeline.num_ranks} ranks, "
          f"{sum(len(actions) for actions in result.timeline.actions):,} actions, {height_px} pixels tall")
    print(f"png_s={best_s:.3f}")


if __name__ == "__main__":
    main()
