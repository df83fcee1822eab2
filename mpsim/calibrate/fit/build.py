"""From the workers' raw measurements to a calibration profile.

All ranks measure every op at the same time (so each op is timed with the machine as
loaded as in training); an op's point is the mean of the ranks' medians, with the
larger of their spreads. Links are measured once for the group (rank 0 reports them).
The curves (``mpsim/calibrate/fit/fitting.py``) are fitted here; the in-job fit of a
multiplier and a per-action overhead is added later by ``mpsim validate``.
"""

from __future__ import annotations

import datetime
import statistics
from collections import defaultdict

from mpsim.calibrate.fit import fitting
from mpsim.calibrate.measure.machine import FOREIGN_CPU_LIMIT, cpu_count
from mpsim.specs.calibration import (AttentionCurve, AttentionPoint, CalibrationProfile, CollectiveFit,
                                     ComputeProfile, Conditions, DeviceInfo, GemmCurve, GemmPoint, LinkFit,
                                     LinksProfile, MemoryPoint, SizePoint, SplitBackward, StreamFit)


def merge_ranks(ops: list[dict], results: list[dict]) -> list[tuple[dict, dict]]:
    """(op record, measurement merged over ranks) for every op measured."""
    merged = []
    for index, record in enumerate(ops):
        per_rank = [r["ops"][index] for r in results if "ops" in r]
        seconds = statistics.fmean(m["seconds"] for m in per_rank)
        merged.append((record, {"seconds": seconds, "spread": max(m["spread"] for m in per_rank),
                                "samples": sum(m["samples"] for m in per_rank),
                                "foreign_cpu_share": max(m.get("foreign_cpu_share", 0.0) for m in per_rank),
                                "slowdown": max(m.get("slowdown", 1.0) for m in per_rank)}))
    return merged


def _measured(m: dict) -> dict:
    return {"seconds": m["seconds"], "spread": m["spread"], "samples": m["samples"]}


def compute_profile(merged: list[tuple[dict, dict]], dtype: str, peak_flops: float,
                    fallback_attention: tuple[float, float]) -> ComputeProfile:
    """Points and fitted curves of every compute op measured."""
    gemms, attention, memory = [], [], []
    for record, m in merged:
        if record["kind"] == "gemm":
            gemms.append(GemmPoint(shape=tuple(record["shape"]), layout=record["layout"], flops=record["flops"],
                                   **_measured(m)))
        elif record["kind"] == "attention":
            c = record["context"]
            attention.append(AttentionPoint(direction=record["direction"], fused=record.get("fused", True),
                                            shape=(c["batch"], c["heads_local"], c["seq"], c["head_dim"]),
                                            flops=record["flops"], **_measured(m)))
        else:
            memory.append(MemoryPoint(name=record["name"], bytes=record["bytes"], **_measured(m)))
    if not gemms:
        raise ValueError("no GEMM was measured; the efficiency curve needs some")
    max_eff, half, rms = fitting.gemm_curve([p.flops for p in gemms], [p.seconds for p in gemms], peak_flops)
    fractions: dict[str, list[float]] = defaultdict(list)
    for point in attention:
        if point.fused:
            fractions[point.direction].append(point.flops / (point.seconds * peak_flops))
    curve = AttentionCurve(
        forward_fraction=statistics.median(fractions["forward"]) if fractions["forward"] else fallback_attention[0],
        backward_fraction=statistics.median(fractions["backward"]) if fractions["backward"] else fallback_attention[1])
    if memory:
        latency, bandwidth, rms_mem = fitting.alpha_beta([p.bytes for p in memory], [p.seconds for p in memory])
        overall = StreamFit(bandwidth=bandwidth, latency_s=latency, rms_error=rms_mem)
    else:
        overall = StreamFit(bandwidth=1e10, latency_s=0.0)
    by_name: dict[str, StreamFit] = {}
    names: dict[str, list[MemoryPoint]] = defaultdict(list)
    for point in memory:
        names[point.name].append(point)
    for name, points in names.items():
        latency, bandwidth, rms_name = fitting.alpha_beta([p.bytes for p in points], [p.seconds for p in points])
        by_name[name] = StreamFit(bandwidth=bandwidth, latency_s=latency, rms_error=rms_name)
    return ComputeProfile(dtype=dtype, gemm_points=gemms,
                          gemm_curve=GemmCurve(peak_flops=peak_flops, max_efficiency=max_eff,
                                               half_efficiency_flops=half, rms_error=rms),
                          attention_points=attention, attention_curve=curve, memory_points=memory,
                          memory_fit=overall, memory_by_name=by_name)


def split_backward(results: list[dict]) -> SplitBackward | None:
    """The split-backward measurement, averaged over the ranks that made it."""
    per_rank = [r["split_backward"] for r in results if r.get("split_backward")]
    if not per_rank:
        return None
    mean = {key: statistics.fmean(m[key] for m in per_rank)
            for key in ("full_s", "input_s", "weight_s", "weight_slowdown")}
    return SplitBackward(**mean, spread=max(m["spread"] for m in per_rank),
                         samples=sum(m["samples"] for m in per_rank))


def _link_fit(points: list[dict]) -> tuple[float, float, float, list[SizePoint]]:
    sizes = [SizePoint(bytes=p["bytes"], seconds=p["seconds"], spread=p["spread"], samples=p["samples"])
             for p in points]
    latency, bandwidth, rms = fitting.alpha_beta([p.bytes for p in sizes], [p.seconds for p in sizes])
    return latency, bandwidth, rms, sizes


def links_profile(raw: dict, backend: str) -> LinksProfile | None:
    """Alpha-beta fits of the link measurements (None when only one rank ran)."""
    if not raw or not raw.get("p2p"):
        return None
    latency, bandwidth, rms, sizes = _link_fit(raw["p2p"])
    p2p = LinkFit(latency_s=latency, bandwidth=bandwidth, rms_error=rms, points=sizes)
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for point in raw.get("collectives", []):
        groups[(point["kind"], point["ranks"])].append(point)
    collectives = []
    for (kind, ranks), points in sorted(groups.items()):
        latency, bandwidth, rms, sizes = _link_fit(points)
        if bandwidth == float("inf"):
            # the time did not grow with the size over the sizes measured (timed after compute, a
            # small collective's time is mostly the wait for its peers): a flat line, its latency
            # the median time
            latency = statistics.median(p.seconds for p in sizes)
            rms = (sum((latency / p.seconds - 1.0) ** 2 for p in sizes) / len(sizes)) ** 0.5
            bandwidth = None
        collectives.append(CollectiveFit(kind=kind, ranks=ranks, latency_s=latency, bandwidth=bandwidth,
                                         rms_error=rms, points=sizes))
    return LinksProfile(backend=backend, p2p=p2p, collectives=collectives)


def conditions(results: list[dict], environment: dict[str, str], kept: list[dict]) -> Conditions:
    """Load averages around the job, the largest foreign CPU share and canary slowdown any kept number saw."""
    first = results[0]
    share = max((k.get("foreign_cpu_share", 0.0) for k in kept), default=None)
    slowdown = max((k.get("slowdown", 1.0) for k in kept), default=None)
    return Conditions(load_average_before=list(first.get("load_average_before") or []) or None,
                      load_average_after=list(first.get("load_average_after") or []) or None,
                      foreign_cpu_share=share, canary_slowdown=slowdown,
                      busy=share is not None and share > FOREIGN_CPU_LIMIT, environment=environment)


def build_profile(ops: list[dict], results: list[dict], *, device: str, world: int, threads: int, dtype: str,
                  accelerator, environment: dict[str, str], description: str = "") -> CalibrationProfile:
    """The profile of one job's measurements (ops and, when measured, links)."""
    merged = merge_ranks(ops, results)
    eff = accelerator.efficiency
    compute = compute_profile(merged, dtype, accelerator.peak(dtype), (eff.attention_forward, eff.attention_backward))
    compute = compute.model_copy(update={"split_backward": split_backward(results)})
    links = links_profile(results[0].get("links", {}), "nccl" if device == "cuda" else "gloo")
    kept = [m for _, m in merged] + [r["split_backward"] for r in results if r.get("split_backward")]
    if results[0].get("links"):
        kept.append(results[0]["links"])
    first = results[0]
    info = DeviceInfo(kind=device, name=first.get("device_name", ""), cores=cpu_count(), ranks=world,
                      threads_per_rank=threads, torch=first.get("torch", ""), python=first.get("python", ""),
                      platform=first.get("platform", ""))
    created = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return CalibrationProfile(description=description, created=created, device=info,
                              conditions=conditions(results, environment, kept), compute=compute, links=links)
