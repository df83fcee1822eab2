"""mpsim's deduplicating MoE dispatch against DeepEP's published bandwidths.

DeepEP's V1 documentation (github.com/deepseek-ai/DeepEP at dd758ca, ``docs/legacy.md``,
"Normal kernels with NVLink and RDMA forwarding") times its dispatch and combine on H800
GPUs (about 160 GB/s of NVLink each) with one ConnectX-7 400 Gb/s NIC per GPU, in
DeepSeek-V3's pretraining setting: 4,096 tokens per rank, hidden 7,168, top 8 of 256
experts (across nodes from at most 4 groups, one per node), fp8 dispatch and bf16 combine. It prints each
run's "bottleneck bandwidth", bytes over time, counted as its test script counts them
(``tests/legacy/test_internode.py``, ``test_intranode.py``): over RDMA one copy per node a
token reaches, its own node included; over NVLink one copy per GPU that receives it, the
sender included.

This script prices the same dispatch and combine with ``mpsim/cost/dispatch.py`` on the
shipped ``dgx-h100`` system with its NVLink cut to the H800's (400 GB/s both ways, 8
links) and counts the bytes the same way, so predicted and published bandwidths compare
directly: a predicted bandwidth above the published one is a prediction faster than the
run. Nothing here is fitted to these figures. Last line::

    rows=<n> mean_abs_error_pct=<x> mean_signed_error_pct=<y>

Usage: python benchmarks/deepep_dispatch.py
"""

from __future__ import annotations

from pathlib import Path

from mpsim.cost.collectives import gpu_group
from mpsim.cost.dispatch import deduplicated_all_to_all_s, token_spread
from mpsim.cost.groups import group_placements
from mpsim.resolve import resolve
from mpsim.specs import load_scenario
from mpsim.workload.ops import Routing, collective

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "deepseek_v3_2048xh100.yaml"
H800 = ["cluster.system.scale_up.bandwidth_per_device=200 GB/s", "cluster.system.scale_up.links_per_device=8"]
TOKENS, HIDDEN, TOP_K, EXPERTS = 4096, 7168, 8, 256
FP8_TOKEN_BYTES = HIDDEN + 4 * HIDDEN // 128  # fp8 values and a float32 scale per 128
BF16_TOKEN_BYTES = 2 * HIDDEN
# (EP ranks, dispatch GB/s, combine GB/s): docs/legacy.md, the normal kernels' table
PUBLISHED = [(8, 153.0, 158.0), (16, 43.0, 43.0), (32, 58.0, 57.0), (64, 51.0, 50.0)]


def predicted_gbps(ranks: int, token_bytes: int) -> tuple[float, str]:
    """Bandwidth counted as DeepEP counts it, over the fabric its table names, and that fabric."""
    nodes = max(1, ranks // 8)
    # the groups DeepEP's tests take: across nodes one per node, min(nodes, 4) of them per token
    # (test_internode.py); inside one node none (test_intranode.py)
    groups, picked = (1, 1) if nodes == 1 else (nodes, min(nodes, 4))
    experts_overrides = [f"cluster.nodes={nodes}", "parallel.pp=1", f"parallel.ep={ranks}", "parallel.vpp=1",
                         "parallel.layers_per_stage=auto", "parallel.schedule=1f1b",
                         f"parallel.global_batch_size={nodes * 8}"]
    scenario = load_scenario(SCENARIO, H800 + experts_overrides).scenario
    place = group_placements(resolve(scenario))["ep"]
    routing = Routing(EXPERTS, TOP_K, groups, picked)
    op = collective("dispatch", "all-to-all", "ep", TOKENS * TOP_K * token_bytes, routing)
    seconds = deduplicated_all_to_all_s(op, gpu_group(place, scenario.cluster.system))
    spread = token_spread(routing, ranks, 8)
    if nodes == 1:
        counted, fabric = spread.nvlink * ranks / (ranks - 1), "NVLink"  # the sender's own copy too
    else:
        counted, fabric = spread.network * nodes / (nodes - 1), "RDMA"  # the sender's own node too
    return counted * TOKENS * token_bytes / seconds / 1e9, fabric


def main() -> int:
    errors = []
    print(f"{'EP':>4} {'kernel':9} {'fabric':7} {'published':>10} {'predicted':>10} {'error':>8}")
    for ranks, dispatch, combine in PUBLISHED:
        for kernel, published, token_bytes in (("dispatch", dispatch, FP8_TOKEN_BYTES),
                                               ("combine", combine, BF16_TOKEN_BYTES)):
            gbps, fabric = predicted_gbps(ranks, token_bytes)
            # a higher bandwidth is a shorter time: the error is that of the predicted time
            error = published / gbps - 1
            errors.append(error)
            print(f"{ranks:>4} {kernel:9} {fabric:7} {published:>8.1f} GB/s {gbps:>6.1f} GB/s {100 * error:>+7.1f}%")
    mean_abs = 100 * sum(abs(e) for e in errors) / len(errors)
    mean_signed = 100 * sum(errors) / len(errors)
    print(f"rows={len(errors)} mean_abs_error_pct={mean_abs:.2f} mean_signed_error_pct={mean_signed:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
