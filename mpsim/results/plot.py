"""Timeline pictures of simulated steps: one lane per pipeline rank.

Forward, backward, weight-gradient and overlapped forward+backward actions are coloured
blocks with their microbatch number on them. Idle time is drawn by cause (the
schedule's fill and drain, stage imbalance, a transfer in flight, one's own blocking
sends), each with its own shade and hatch. TP collectives are a red strip along the
bottom of a block; recompute an orange and DP gradient reduction a purple strip along
the top; the optimizer step a brown block at the end. The key sits in one row above the
lanes. Several results (one per schedule) stack on a shared time axis.
"""

from __future__ import annotations

from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from mpsim.results.idle import idle_intervals  # noqa: E402
from mpsim.results.metrics import Summary  # noqa: E402
from mpsim.schedules.actions import Overlapped  # noqa: E402
from mpsim.simulate import BubbleReference, SimulationResult  # noqa: E402

COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#55A868", "W": "#8C8C3F", "FB": "#3E9C9C",
          "recompute": "#DD8452", "tp": "#C44E52", "dp-comm": "#8172B3", "embedding-sync": "#8172B3",
          "optimizer": "#937860", "schedule": "#EEEEEE", "imbalance": "#F7E7B4", "stage-wait": "#F7E7B4",
          "transfer": "#F4C7C3", "send": "#DCD0EE"}
HATCHES = {"schedule": "///", "imbalance": "...", "stage-wait": "...", "transfer": "xxx", "send": "\\\\\\"}
LABELS = {"F": "forward", "B": "backward", "W": "weight grad", "FB": "forward+backward", "recompute": "recompute",
          "tp": "TP comm", "dp-comm": "DP grad reduce", "optimizer": "optimizer", "schedule": "idle: fill/drain",
          "imbalance": "idle: stage imbalance", "stage-wait": "idle: other stage", "transfer": "idle: transfer",
          "send": "idle: own send"}
LANE = 0.8


def _label(item) -> str:
    if isinstance(item, Overlapped):
        return f"{item.forward.microbatch}|{item.backward.microbatch}"
    return str(item.microbatch)


def _draw(ax, result: SimulationResult, scale: float, pixels_per_unit: float,
          reference: BubbleReference | None) -> set[str]:
    """Draw one result's lanes; returns the keys drawn (for the legend)."""
    timeline = result.timeline
    ranks = timeline.num_ranks
    text_size = 7 if ranks <= 16 else 5
    drawn: set[str] = set()
    for rank in range(ranks):
        top = rank - LANE / 2  # the y axis is inverted (rank 0 on top): top edge on screen
        idle: dict[str, list] = defaultdict(list)
        waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
        for gap in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
            idle[gap.kind].append((gap.start_s * scale, (gap.end_s - gap.start_s) * scale))
        for kind, spans in idle.items():
            ax.broken_barh(spans, (top, LANE), facecolors=COLORS[kind], edgecolor="#BBBBBB", hatch=HATCHES[kind],
                           linewidth=0)
            drawn.add(kind)
        blocks: dict[str, list] = defaultdict(list)
        strips: dict[str, list] = defaultdict(list)
        for record in timeline.actions[rank]:
            item = record.action
            kind = "FB" if isinstance(item, Overlapped) else ("B" if item.kind == "I" else item.kind)
            start, dur = record.start_s * scale, (record.end_s - record.start_s) * scale
            blocks[kind].append((start, dur))
            for segment in result.cost(item).segments:
                if segment.stream == "tp" or segment.category == "recompute":
                    key = "tp" if segment.stream == "tp" else "recompute"
                    strips[key].append(((record.start_s + segment.offset_s) * scale, segment.duration_s * scale))
            label = _label(item)
            if dur * pixels_per_unit > 1.25 * text_size * len(label) + 3:
                ax.text(start + dur / 2, rank, label, ha="center", va="center", fontsize=text_size, color="white")
        for kind, spans in blocks.items():
            thin = min(w for _, w in spans) * pixels_per_unit < 3
            ax.broken_barh(spans, (top, LANE), facecolors=COLORS[kind], edgecolor="white", linewidth=0 if thin else 0.4)
            drawn.add(kind)
        if strips["recompute"]:
            ax.broken_barh(strips["recompute"], (top, LANE * 0.2), facecolors=COLORS["recompute"], linewidth=0)
            drawn.add("recompute")
        if strips["tp"]:
            ax.broken_barh(strips["tp"], (top + LANE * 0.8, LANE * 0.2), facecolors=COLORS["tp"], linewidth=0)
            drawn.add("tp")
    for sync in timeline.syncs:
        top = sync.rank - LANE / 2
        span = [(sync.start_s * scale, (sync.end_s - sync.start_s) * scale)]
        if sync.kind == "optimizer":
            ax.broken_barh(span, (top, LANE), facecolors=COLORS["optimizer"], linewidth=0)
            drawn.add("optimizer")
        else:
            ax.broken_barh(span, (top, LANE * 0.2), facecolors=COLORS[sync.kind], linewidth=0)
            drawn.add("dp-comm")
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(ranks)], fontsize=8 if ranks <= 16 else 5)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return drawn


def plot_timelines(results: list[tuple[SimulationResult, Summary, str]], path: str,
                   references: list[BubbleReference | None] | None = None) -> None:
    """Draw one panel per (result, summary, title) on a shared time axis to ``path``."""
    references = references or [None] * len(results)
    longest = max(result.timeline.step_time_s for result, _, _ in results)
    scale, unit = (1.0, "s") if longest >= 1 else (1e3, "ms")
    width_in = 15.0
    heights = [1.0 + 0.42 * result.timeline.num_ranks for result, _, _ in results]
    fig, axes = plt.subplots(len(results), 1, figsize=(width_in, min(sum(heights) + 0.6, 40)), sharex=True,
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    pixels_per_unit = width_in * 0.85 * fig.dpi / (longest * scale)
    drawn: set[str] = set()
    for ax, (result, summary, title), reference in zip(axes[:, 0], results, references):
        drawn |= _draw(ax, result, scale, pixels_per_unit, reference)
        memory = max(m.peak_memory_bytes for m in summary.memory) / 2**30
        ax.set_title(f"{title}: step {summary.step_time_s * scale:.4g} {unit}, bubble "
                     f"{100 * summary.bubble_fraction:.1f} %, MFU {100 * summary.mfu:.1f} %, peak memory "
                     f"{memory:.1f} GiB", fontsize=9, loc="left")
    axes[-1, 0].set_xlim(0, longest * scale * 1.005)
    axes[-1, 0].set_xlabel(f"time ({unit}); numbers on blocks are microbatches (forward|backward for overlapped pairs)")
    order = ["F", "B", "W", "FB", "recompute", "tp", "dp-comm", "optimizer", "schedule", "imbalance", "stage-wait",
             "transfer", "send"]
    handles = [Patch(facecolor=COLORS[k], edgecolor="#BBBBBB" if k in HATCHES else COLORS[k],
                     hatch=HATCHES.get(k), label=LABELS[k]) for k in order if k in drawn]
    fig.legend(handles=handles, loc="upper left", ncol=min(len(handles), 8), frameon=False, fontsize=8,
               bbox_to_anchor=(0.01, 1.0), handlelength=1.5)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=fig.dpi if path.endswith(".svg") else 150)
    plt.close(fig)


def plot_timeline(result: SimulationResult, summary: Summary, path: str, title: str | None = None,
                  reference: BubbleReference | None = None) -> None:
    """Draw one result's timeline to ``path`` (PNG, SVG or PDF, from the extension)."""
    plot_timelines([(result, summary, title or summary.scenario)], path, [reference])
