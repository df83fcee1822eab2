"""Rebuild the small trace extracts in this folder from the full traces (see README.md).

    python tests/data/traces/extract.py [--source FOLDER]

``--source`` is the folder holding the full traces (default: ``shared/traces`` beside the
repository). Each extract keeps one ``ProfilerStep`` and, of the GPU events launched in it,
every NCCL kernel, and GEMM kernels (cutlass/cuBLAS names) and other GPU events spread
evenly over the step, plus everything that links them: each one's CUDA runtime call, its
``ac2g``/``async_cpu_to_gpu`` flow events, and every CPU op and annotation on the launching
thread that encloses the runtime call. Top-level keys (``deviceProperties``, ``distributedInfo``, ...) and the
metadata events are kept as they are. The same source gives the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE.parents[2].parent / "shared" / "traces"

REPOSITORY = HERE.parents[2]
# extract name -> (source file, step kept, GEMM kernels kept, other kernels kept, the folder of the
# source when it is not --source: the project's own traces live in the repository)
EXTRACTS = {
    "cnn_allreduce_step5.json.gz": ("a100_2rank_cnn_allreduce_rank0.json.gz", 5, 12, 60, None),
    "recsys8_step1010.json.gz": ("a100_8rank_recsys_rank3.json.gz", 1010, 24, 40, None),
    "recsys16_step551.json.gz": ("a100_16rank_recsys_rank0.json.gz", 551, 24, 40, None),
    "h200_gpipe_step3.json.gz": ("h200_gpipe_trace_rank0.json.gz", 3, 24, 60, REPOSITORY / "benchmarks" / "data"),
}
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
OPS = ("cpu_op", "user_annotation")
FLOWS = ("ac2g", "async_cpu_to_gpu")
GEMM_NAME = re.compile(r"(?<!fb)gemm|gemv|^nvjet_", re.IGNORECASE)  # nvjet_*: cuBLAS 12.9+ on Hopper
# calls that launch GPU work: the runtime's, and the driver's where a library calls it directly
# (cuBLAS's cuLaunchKernelEx); a runtime call wins where both carry one correlation
LAUNCHES = ("cuda_driver", "cuda_runtime")


def extract(events: list, step: int, gemm_count: int, other_count: int) -> list:
    """The events kept from ``events`` (in their original order)."""
    step_event = next(e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("ph") == "X")
    lo, hi = step_event["ts"], step_event["ts"] + step_event["dur"]
    runtime = {e["args"]["correlation"]: e for category in LAUNCHES for e in events
               if e.get("ph") == "X" and e.get("cat") == category and "correlation" in e.get("args", {})}
    launched = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU:
            call = runtime.get(e["args"].get("correlation"))
            if call is not None and lo <= call["ts"] <= hi:
                launched.append((call["ts"], e["args"]["correlation"], e))
    launched.sort(key=lambda item: (item[0], item[1]))
    nccl = [e for _, _, e in launched if e["name"].startswith("nccl")]
    named = [e for _, _, e in launched if GEMM_NAME.search(e["name"]) and e not in nccl]
    # GEMMs and the rest spread evenly over the step, so forward and backward both appear
    gemms = named[::max(1, -(-len(named) // gemm_count))][:gemm_count]
    chosen = {id(e) for e in nccl + gemms}
    rest = [e for _, _, e in launched if id(e) not in chosen]
    others = rest[::max(1, -(-len(rest) // other_count))][:other_count]
    kept_gpu = nccl + gemms + others
    correlations = {e["args"]["correlation"] for e in kept_gpu}
    calls = [runtime[c] for c in correlations]
    keep = {id(e) for e in kept_gpu} | {id(c) for c in calls} | {id(step_event)}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in OPS:
            start, end = e["ts"], e["ts"] + e["dur"]
            if any(c["pid"] == e["pid"] and c["tid"] == e["tid"] and start <= c["ts"] <= end for c in calls):
                keep.add(id(e))
        elif (e.get("ph") in ("s", "f") and e.get("cat") in FLOWS and e.get("id") in correlations) or \
                e.get("ph") == "M":  # the launch's flows; process and thread names
            keep.add(id(e))
    return [e for e in events if id(e) in keep]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="folder of the full traces")
    args = parser.parse_args(argv)
    for name, (source, step, gemm_count, other_count, folder) in EXTRACTS.items():
        with gzip.open((folder or args.source) / source, "rt", encoding="utf-8") as stream:
            top = json.load(stream)
        kept = extract(top["traceEvents"], step, gemm_count, other_count)
        out = {key: (kept if key == "traceEvents" else value) for key, value in top.items()}
        if "traceName" in out:  # the recording machine's temporary file name says nothing here
            out["traceName"] = "trace.json"
        data = json.dumps(out, separators=(",", ":")).encode("utf-8")
        (HERE / name).write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        print(f"{name}: {len(kept)} of {len(top['traceEvents'])} events from {source}, ProfilerStep#{step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
