"""Seconds and megabytes of the Chrome trace `mpsim run --trace` writes for two large jobs.

(a) Megatron 1T on 512 A100 (PP 64, 512 microbatches: 65,536 actions) and (b) Megatron
1T on 3,072 A100 (PP 64, DP 6, 64 microbatches). Both are past the full trace's size
limit, so the command writes the compact trace (docs/traces.md); this script chooses the
form the same way. The time is from a finished simulation (and its bubble reference,
which the summary needs anyway) to the closed file, best of three: the machine's other
load only ever adds time. Targets: each <= 2 s and <= 50 MB. (c) times the full trace
``--trace-full`` writes for Megatron 530B on 280 A100 (1.8 million slices), for reference.
The last line is ``trace_s=<seconds> trace_mb=<megabytes>`` for (b).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from mpsim.results.trace import chosen_mode, write_trace
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
REPEATS = 3


def trace_cost(name: str, folder: Path, requested: str = "auto") -> tuple[float, float, str]:
    """(best seconds to write the trace, its size in MB, the form written); ``requested`` as
    ``chosen_mode`` takes it (``full`` for ``--trace-full``)."""
    result = simulate(load_scenario(SCENARIOS / name).scenario)
    reference = bubble_reference(result)
    path = folder / "trace.json"
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        mode, _ = chosen_mode(result, requested=requested)
        write_trace(result, str(path), reference=reference, compact=mode == "compact")
        best = min(best, time.perf_counter() - start)
    return best, path.stat().st_size / 1e6, mode


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        a_s, a_mb, a_mode = trace_cost("megatron_1t_512xa100.yaml", Path(folder))
        print(f"(a) Megatron 1T, 512 A100: {a_mode} trace, {a_s:.2f} s, {a_mb:.1f} MB")
        b_s, b_mb, b_mode = trace_cost("megatron_1t_3072xa100.yaml", Path(folder))
        print(f"(b) Megatron 1T, 3,072 A100: {b_mode} trace, {b_s:.2f} s, {b_mb:.1f} MB")
        # what --trace-full costs on a large step (1.8 million slices; no target: past the limit
        # the compact trace is the default)
        c_s, c_mb, c_mode = trace_cost("megatron_530b_280xa100.yaml", Path(folder), requested="full")
        print(f"(c) Megatron 530B, 280 A100, --trace-full: {c_mode} trace, {c_s:.2f} s, {c_mb:.1f} MB")
    print(f"trace_s={b_s:.3f} trace_mb={b_mb:.2f}")


if __name__ == "__main__":
    main()
