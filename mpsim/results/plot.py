"""Timeline picture of a simulated step: one lane per pipeline rank.

Forward, backward and weight-gradient actions are coloured blocks with their microbatch
number on them; idle time is hatched grey; TP collectives are a red strip along the
bottom of a block, recompute an orange and DP gradient reduction a purple strip along
the top, the optimizer step a brown block at the end. The key sits in one row above the
lanes.
"""

from __future__ import annotations

from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from mpsim.results.metrics import Summary  # noqa: E402
from mpsim.simulate import SimulationResult  # noqa: E402

COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#55A868", "W": "#8C8C3F", "recompute": "#DD8452",
          "tp": "#C44E52", "dp-comm": "#8172B3", "embedding-sync": "#8172B3", "optimizer": "#937860",
          "idle": "#EEEEEE"}
LABELS = {"F": "forward", "B": "backward", "W": "weight grad", "recompute": "recompute", "tp": "TP comm",
          "dp-comm": "DP grad reduce", "optimizer": "optimizer", "idle": "idle"}


def _idle_intervals(records: list, pipeline_end: float) -> list[tuple[float, float]]:
    gaps, cursor = [], 0.0
    for record in records:
        if record.start_s > cursor:
            gaps.append((cursor, record.start_s - cursor))
        cursor = max(cursor, record.end_s)
    if pipeline_end > cursor:
        gaps.append((cursor, pipeline_end - cursor))
    return gaps


def plot_timeline(result: SimulationResult, summary: Summary, path: str, title: str | None = None) -> None:
    """Draw the timeline to ``path`` (PNG, SVG or PDF, from the extension)."""
    timeline = result.timeline
    ranks = timeline.num_ranks
    step = timeline.step_time_s
    scale, unit = (1.0, "s") if step >= 1 else (1e3, "ms")
    width_in = 15.0
    fig, ax = plt.subplots(figsize=(width_in, min(1.2 + 0.42 * ranks, 30)))
    lane = 0.8
    pixels_per_unit = width_in * 0.85 * fig.dpi / (step * scale)
    text_size = 7 if ranks <= 16 else 5
    for rank in range(ranks):
        records = timeline.actions[rank]
        y = rank - lane / 2
        ax.broken_barh([(s * scale, w * scale) for s, w in _idle_intervals(records, timeline.pipeline_end_s)],
                       (y, lane), facecolors=COLORS["idle"], edgecolor="#BBBBBB", hatch="///", linewidth=0)
        blocks: dict[str, list] = defaultdict(list)
        strips: dict[str, list] = defaultdict(list)
        for record in records:
            action = record.action
            start, dur = record.start_s * scale, (record.end_s - record.start_s) * scale
            blocks[action.kind].append((start, dur))
            for segment in result.costs[(action.stage, action.kind)].segments:
                if segment.stream == "tp" or segment.category == "recompute":
                    key = "tp" if segment.stream == "tp" else "recompute"
                    strips[key].append(((record.start_s + segment.offset_s) * scale, segment.duration_s * scale))
            if dur * pixels_per_unit > 1.25 * text_size * len(str(action.microbatch)) + 3:
                ax.text(start + dur / 2, rank, str(action.microbatch), ha="center", va="center",
                        fontsize=text_size, color="white")
        for kind, spans in blocks.items():
            thin = min(w for _, w in spans) * pixels_per_unit < 3
            ax.broken_barh(spans, (y, lane), facecolors=COLORS[kind], edgecolor="white", linewidth=0 if thin else 0.4)
        # the y axis is inverted (rank 0 on top), so y is a lane's top edge on screen
        if strips["recompute"]:
            ax.broken_barh(strips["recompute"], (y, lane * 0.2), facecolors=COLORS["recompute"], linewidth=0)
        if strips["tp"]:
            ax.broken_barh(strips["tp"], (y + lane * 0.8, lane * 0.2), facecolors=COLORS["tp"], linewidth=0)
    for sync in timeline.syncs:
        y = sync.rank - lane / 2
        span = [(sync.start_s * scale, (sync.end_s - sync.start_s) * scale)]
        if sync.kind == "optimizer":
            ax.broken_barh(span, (y, lane), facecolors=COLORS["optimizer"], linewidth=0)
        else:
            ax.broken_barh(span, (y, lane * 0.2), facecolors=COLORS[sync.kind], linewidth=0)
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_xlim(0, step * scale * 1.005)
    schedule = result.schedule
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(ranks)], fontsize=8 if ranks <= 16 else 5)
    ax.set_xlabel(f"time ({unit})")
    kinds = ["F", "B"] + (["W"] if schedule.split_backward else [])
    present = kinds + [k for k in ("recompute", "tp") if any(
        seg.stream == "tp" if k == "tp" else seg.category == "recompute"
        for cost in result.costs.values() for seg in cost.segments)]
    present += [k for k in ("dp-comm", "optimizer") if any(s.kind == k for s in timeline.syncs)] + ["idle"]
    handles = [Patch(facecolor=COLORS[k], edgecolor="#BBBBBB" if k == "idle" else COLORS[k],
                     hatch="///" if k == "idle" else None, label=LABELS[k]) for k in present]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), frameon=False,
              fontsize=8, handlelength=1.5)
    heading = title or summary.scenario
    ax.set_title(f"{heading}\nstep {summary.step_time_s * scale:.3g} {unit}, bubble "
                 f"{100 * summary.bubble_fraction:.1f} %, MFU {100 * summary.mfu:.1f} %  —  numbers on blocks are "
                 f"microbatches", fontsize=10, loc="left", pad=22)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=fig.dpi if path.endswith(".svg") else 150)
    plt.close(fig)
