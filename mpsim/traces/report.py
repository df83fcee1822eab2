"""A ``TraceSummary`` as the text ``mpsim trace summary`` prints, and as JSON-ready data."""

from __future__ import annotations

from dataclasses import asdict

from mpsim.traces.summary import TraceSummary
from mpsim.units import format_bytes, format_seconds


def _share(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:5.1f} %" if whole > 0 else "    -"


def _rate(value: float | None, unit: float, suffix: str) -> str:
    return f"{value / unit:.1f} {suffix}".rstrip() if value is not None else "-"


def _cpu(summary: TraceSummary) -> str:
    return f" (ProfilerStep on the CPU {format_seconds(summary.cpu_step_s)})" if summary.cpu_step_s is not None else ""


def _steps_line(summary: TraceSummary) -> str:
    if summary.steps == (None,):
        return "whole trace (no ProfilerStep ranges recorded)"
    if len(summary.steps) == 1:
        return f"step {summary.steps[0]}"
    return f"mean over {len(summary.steps)} steps ({summary.steps[0]}..{summary.steps[-1]})"


def format_summary(summary: TraceSummary, top: int = 10) -> str:
    """The summary as aligned text: times, the ``top`` GEMM shapes and collective groups."""
    rank = f"rank {summary.rank}" if summary.rank is not None else "rank ?"
    world = f" of {summary.world_size}" if summary.world_size is not None else ""
    times = (f"  {_steps_line(summary)}: on the GPU {format_seconds(summary.span_s)}{_cpu(summary)}, busy "
             f"{format_seconds(summary.busy_s)} ({_share(summary.busy_s, summary.span_s).strip()}), idle "
             f"{format_seconds(summary.idle_s)}")
    lines = [f"{summary.source}: {rank}{world}, {summary.device_name or 'unknown device'}", times,
             "  busy by category (union of each category's kernels; streams may overlap):"]
    for category, seconds in summary.category_s.items():
        if seconds > 0:
            lines.append(f"    {category:<16} {format_seconds(seconds):>10}  {_share(seconds, summary.span_s)}")
            if category == "collective":
                for kind, kind_s in summary.collective_kind_s.items():
                    lines.append(f"      {kind:<14} {format_seconds(kind_s):>10}  {_share(kind_s, summary.span_s)}")
    if summary.overlap_share is not None:
        lines.append(f"  compute overlapping collectives: {format_seconds(summary.overlap_s)} "
                     f"({100.0 * summary.overlap_share:.1f} % of collective time)")
    if summary.peer_wait_s is not None:
        lines.append(f"  waiting for the slowest peer inside collectives found on every rank of their group: "
                     f"{format_seconds(summary.peer_wait_s)} of their {format_seconds(summary.peer_matched_s)}")
    beside = summary.beside_collective
    if beside is not None:
        spread = f"{beside.min_ratio:.2f}x-{beside.max_ratio:.2f}x"
        lines.append(f"  GEMMs entirely beside a collective took {beside.median_ratio:.2f}x their time alone (median "
                     f"over {beside.shapes} shapes that ran both ways, {spread}; {beside.beside_kernels} kernels "
                     f"beside, {beside.alone_kernels} alone)")
    shaped = sum(row.count for row in summary.gemms)
    where = "in the step" if len(summary.steps) == 1 else f"in {len(summary.steps)} steps" \
        if summary.steps != (None,) else "in the trace"
    if not summary.gemm_kernels:
        lines.append(f"  GEMM shapes: no GEMM kernels {where}")
    elif not shaped:
        # an empty table would read as a fault of the reader: say why there is none
        lines.append(f"  GEMM shapes: none of the {summary.gemm_kernels} GEMM kernels {where} has one (no op linked "
                     f"to them records its operands' shapes; torch.profiler records them with record_shapes=True)")
    else:
        lines.append(f"  GEMM shapes ({shaped} of the {summary.gemm_kernels} GEMM kernels {where} have one; "
                     f"largest total first):")
    if summary.gemms:
        lines.append(f"    {'op':<12} {'B':>4} {'M':>7} {'N':>7} {'K':>7} {'dtype':<5} {'count':>6} {'mean':>10} "
                     f"{'TFLOP/s':>8}")
    for row in summary.gemms[:top]:
        mark = " *" if row.misaligned else ""
        lines.append(f"    {row.op:<12} {row.batch:>4} {row.m:>7} {row.n:>7} {row.k:>7} {row.dtype:<5} {row.count:>6} "
                     f"{format_seconds(row.mean_s):>10} {_rate(row.achieved_flop_rate, 1e12, ''):>8}{mark}")
    if any(row.misaligned for row in summary.gemms[:top]):
        lines.append(_misaligned_note(summary))
    lines.append(f"  collectives ({summary.collective_kernels} kernels {where}; largest total first):")
    # the transfer alone (from the last rank's start) where the traces of the group's ranks were given
    peers = any(row.transfer_mean_s is not None for row in summary.collectives[:top])
    if summary.collectives:
        lines.append(f"    {'kind':<14} {'alg/proto':<12} {'ranks':>5} {'message':>11} {'count':>6} {'mean':>10} "
                     f"{'algbw':>11} {'busbw':>11}" + (f" {'transfer':>10} {'its busbw':>11}" if peers else ""))
    for row in summary.collectives[:top]:
        algo = "/".join(part for part in (row.algorithm, row.protocol) if part) or "-"
        size = format_bytes(row.message_bytes) if row.message_bytes is not None else "-"
        ranks = str(row.group_size) if row.group_size is not None else "-"
        transfer = ""
        if peers:
            seconds = format_seconds(row.transfer_mean_s) if row.transfer_mean_s is not None else "-"
            transfer = f" {seconds:>10} {_rate(row.transfer_busbw_bytes_per_s, 1e9, 'GB/s'):>11}"
        lines.append(f"    {row.kind:<14} {algo:<12} {ranks:>5} {size:>11} {row.count:>6} "
                     f"{format_seconds(row.mean_s):>10} {_rate(row.algbw_bytes_per_s, 1e9, 'GB/s'):>11} "
                     f"{_rate(row.busbw_bytes_per_s, 1e9, 'GB/s'):>11}{transfer}")
    if peers:
        lines.append("    transfer: from the last rank's start to the kernel's end, the wait for peers taken out (where "
                     "the traces of the group's ranks were given)")
    return "\n".join(lines)


def _misaligned_note(summary: TraceSummary) -> str:
    """What the * marks, and what the misaligned shapes cost, over every shape of the summary."""
    def kernel_time(rows) -> float:
        return sum(row.total_s for row in rows)
    off = [row for row in summary.gemms if row.misaligned]
    return (f"    * a dimension is not a whole number of 16-byte vectors (8 bf16 or 4 fp32 elements): the library runs "
            f"such shapes in\n      element-at-a-time kernels, which padding the dimension avoids; {len(off)} of "
            f"{len(summary.gemms)} shapes, {format_seconds(kernel_time(off))} of "
            f"{format_seconds(kernel_time(summary.gemms))} of the GEMM kernels' time")


def summary_dict(summary: TraceSummary) -> dict:
    """The summary as JSON-ready data: SI units (seconds, bytes, FLOP/s), names say which."""
    return asdict(summary)
