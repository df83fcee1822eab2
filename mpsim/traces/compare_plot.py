"""Measured over predicted: the traced step above the simulated one, on one time axis.

The style of ``mpsim validate``'s own picture (``calibrate/check/plot.py``): two panels
that share the time axis, one lane per pipeline rank. The measured panel draws the
profiler step of median length, each rank from its own ``ProfilerStep`` start (the
ranks' clocks need not agree). In pass mode its blocks are the passes, coloured by kind
and numbered by microbatch: a GPU pass as its kernels, a CPU pass as the computing part
of its annotation with the wait for its input hatched before it. In category mode the
lanes are the step's kernels coloured by category. The predicted panel is the simulated
timeline of the scenario, drawn the same way.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from mpsim.results.plot import PASS_LABELS, action_label, pass_color  # noqa: E402
from mpsim.schedules.actions import Overlapped  # noqa: E402
from mpsim.traces.compare import TraceComparison  # noqa: E402
from mpsim.traces.predicted import convolution_ops, segment_categories, sync_category  # noqa: E402

LANE = 0.8
WAIT_COLOR = "#F4C7C3"
# kernel categories, apart from the pass colours so that the two modes never read alike
CATEGORY_COLORS = {"gemm": "#1F3A93", "attention": "#E67E22", "convolution": "#8E44AD", "elementwise": "#16A085",
                   "collective": "#C0392B", "memcpy": "#7F8C8D", "memset": "#BDC3C7", "other": "#95A5A6"}


def _blocks(ax, lane: int, spans, color: str, label: str | None, right: float) -> None:
    ax.broken_barh(spans, (lane - LANE / 2, LANE), facecolors=color, edgecolor="white", linewidth=0.4)
    if label is not None and spans:
        start = spans[0][0]
        end = spans[-1][0] + spans[-1][1]
        if end - start > 0.02 * right:
            ax.text((start + end) / 2, lane, label, ha="center", va="center", fontsize=6, color="white")


def _measured_passes(ax, comparison: TraceComparison, lanes: dict[int, int], scale: float, right: float) -> None:
    shown = comparison.shown_step
    for rank, trace in comparison.traces.items():
        origin = next((s.start_s for s in trace.steps if s.number == shown), None)
        if origin is None:  # no step common to every trace: nothing to draw on a shared axis
            continue
        for p in comparison.measured[rank]:
            if p.step != shown:
                continue
            if p.wait_s > 0:
                ax.broken_barh([((p.start_s - origin) * scale, p.wait_s * scale)], (lanes[rank] - LANE / 2, LANE),
                               facecolors=WAIT_COLOR, edgecolor="#BBBBBB", hatch="xxx", linewidth=0)
            kind = "FB" if p.parsed.kind == "F&B" else p.parsed.kind
            spans = [((a - origin) * scale, (b - a) * scale) for a, b in p.spans if b > a]
            _blocks(ax, lanes[rank], spans, pass_color(kind), str(p.parsed.microbatch), right)


def _category_color(category: str) -> str:
    return CATEGORY_COLORS.get(category.split(":")[0], CATEGORY_COLORS["other"])


def _measured_kernels(ax, comparison: TraceComparison, lanes: dict[int, int], scale: float) -> set[str]:
    shown = comparison.shown_step
    drawn: set[str] = set()
    for rank, trace in comparison.traces.items():
        step = next((s for s in trace.steps if s.number == shown), None)
        lo, hi = (step.start_s, step.end_s) if step is not None else (trace.kernels[0].start_s, float("inf"))
        by_category: dict[str, list] = {}
        for kernel in trace.kernels:
            if kernel.end_s > lo and kernel.start_s < hi:
                by_category.setdefault(kernel.category, []).append(((kernel.start_s - lo) * scale,
                                                                    kernel.duration_s * scale))
        for category, spans in by_category.items():
            ax.broken_barh(spans, (lanes[rank] - LANE / 2, LANE), facecolors=_category_color(category), linewidth=0)
            drawn.add(category)
    return drawn


def _predicted_categories(ax, comparison: TraceComparison, lanes: dict[int, int], scale: float) -> set[str]:
    """The simulated step's ops by category: each action's segments, the DP stream and the optimizer."""
    result = comparison.result
    convolutions = convolution_ops(result)
    drawn: set[str] = set()
    for rank, records in enumerate(result.timeline.actions):
        by_category: dict[str, list] = {}
        for record in records:
            for offset, seconds, category in segment_categories(result, record.action, convolutions):
                by_category.setdefault(category, []).append(((record.start_s + offset) * scale, seconds * scale))
        for sync in result.timeline.syncs_of(rank):
            by_category.setdefault(sync_category(sync.kind, sync.label), []).append(
                (sync.start_s * scale, (sync.end_s - sync.start_s) * scale))
        for category, spans in by_category.items():
            ax.broken_barh(spans, (lanes[rank] - LANE / 2, LANE), facecolors=_category_color(category), linewidth=0)
            drawn.add(category)
    return drawn


def _predicted(ax, comparison: TraceComparison, lanes: dict[int, int], scale: float, right: float) -> None:
    for rank, records in enumerate(comparison.result.timeline.actions):
        for record in records:
            item = record.action
            kind = "FB" if isinstance(item, Overlapped) else item.kind
            _blocks(ax, lanes[rank], [(record.start_s * scale, (record.end_s - record.start_s) * scale)],
                    pass_color(kind), action_label(item), right)


def plot_comparison(comparison: TraceComparison, path: str) -> None:
    """Write the measured-over-predicted picture of ``comparison`` to ``path``."""
    ranks = comparison.result.timeline.num_ranks
    lanes = {rank: rank for rank in range(ranks)}
    measured_s = 0.0
    for trace in comparison.traces.values():
        for step in trace.steps:
            if step.number == comparison.shown_step:
                measured_s = max(measured_s, step.end_s - step.start_s)
    longest = max(measured_s, comparison.result.timeline.span_s)
    scale, unit = (1.0, "s") if longest >= 1 else (1e3, "ms")
    right = longest * scale * 1.01
    height = 0.9 + 0.35 * ranks
    fig, axes = plt.subplots(2, 1, figsize=(14, min(2 * height + 0.8, 40)), sharex=True)
    for ax in axes:
        ax.set_xlim(0, right)
        ax.set_ylim(ranks - 0.5, -0.5)
        ax.set_yticks(range(ranks))
        ax.set_yticklabels([f"rank {r}" for r in range(ranks)], fontsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    measured_ax, predicted_ax = axes
    if comparison.mode == "passes":
        _measured_passes(measured_ax, comparison, lanes, scale, right)
        _predicted(predicted_ax, comparison, lanes, scale, right)
    else:
        drawn_categories = _measured_kernels(measured_ax, comparison, lanes, scale)
        drawn_categories |= _predicted_categories(predicted_ax, comparison, lanes, scale)
    step_text = f"ProfilerStep#{comparison.shown_step}, {measured_s * scale:.4g} {unit}" \
        if comparison.shown_step is not None else "no profiler step"
    measured_ax.set_title(f"measured ({comparison.mode}): {step_text}, the step of median length; each rank from its "
                          f"own step start", fontsize=9, loc="left")
    predicted_ax.set_title(f"predicted: {comparison.result.scenario.name}, step "
                           f"{comparison.result.timeline.step_time_s * scale:.4g} {unit}", fontsize=9, loc="left")
    predicted_ax.set_xlabel(f"time ({unit}) from the start of the step" + (
        "; numbers on blocks are microbatches" if comparison.mode == "passes" else ""))
    if comparison.mode == "passes":
        drawn = {"FB" if isinstance(r.action, Overlapped) else r.action.kind
                 for records in comparison.result.timeline.actions for r in records}
        drawn |= {"FB" if p.parsed.kind == "F&B" else p.parsed.kind for passes in comparison.measured.values()
                  for p in passes}
        handles = [Patch(facecolor=pass_color(k), label=v) for k, v in PASS_LABELS.items() if k in drawn]
        handles.append(Patch(facecolor=WAIT_COLOR, hatch="xxx", edgecolor="#BBBBBB", label="waiting for its input"))
    else:
        handles = [Patch(facecolor=color, label=name) for name, color in CATEGORY_COLORS.items()
                   if name in {c.split(":")[0] for c in drawn_categories}]
    fig.legend(handles=handles, loc="upper left", ncol=min(len(handles), 7), frameon=False, fontsize=8,
               bbox_to_anchor=(0.01, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_figheight()))
    fig.savefig(path, dpi=120)
    plt.close(fig)
