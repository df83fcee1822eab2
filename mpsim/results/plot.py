"""Timeline pictures of simulated steps: one lane per pipeline rank, at any scale.

Forward, backward, weight-gradient and overlapped forward+backward actions are coloured
blocks with their microbatch number on them when it fits. Idle time is drawn by cause
(the schedule's fill and drain, stage imbalance, a transfer in flight, one's own
blocking sends), each with its own shade and hatch. TP collectives are a red strip along
the bottom of a block; recompute an orange and DP gradient reduction a purple strip
along the top; the optimizer step a brown block at the end. The key sits above the
lanes and names only what was drawn. Several results (one per schedule) stack on a
shared time axis.

The picture has a fixed budget: at most ``MAX_HEIGHT_IN`` inches tall and
``MAX_LANES`` lanes, whatever the job. A pipeline deeper than that is shown by a
representative subset of its ranks (``lanes.choose_ranks``; the picture says which),
and actions narrower than a few pixels are merged into runs (``lanes.merge_runs``). All
blocks of one kind are one compound path (a hatch is filled once per kind, not once per
gap), so the cost of drawing grows with the lanes shown, not with the actions.
"""

from __future__ import annotations

import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch, PathPatch  # noqa: E402
from matplotlib.path import Path  # noqa: E402

from mpsim.results.idle import idle_intervals  # noqa: E402
from mpsim.results.lanes import Lane, choose_ranks, merge_runs  # noqa: E402
from mpsim.results.metrics import Summary  # noqa: E402
from mpsim.schedules.actions import Overlapped  # noqa: E402
from mpsim.simulate import BubbleReference, SimulationResult  # noqa: E402

COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#55A868", "W": "#8C8C3F", "FB": "#3E9C9C", "dense": "#5F8A8B",
          "recompute": "#DD8452", "tp": "#C44E52", "dp-comm": "#8172B3", "embedding-sync": "#8172B3",
          "optimizer": "#937860", "schedule": "#EEEEEE", "imbalance": "#F7E7B4", "stage-wait": "#F7E7B4",
          "transfer": "#F4C7C3", "send": "#DCD0EE", "gather": "#C9C0E4"}
# the passes of a measured-over-predicted picture (mpsim validate, with or without --trace), where
# an input-gradient pass is drawn apart from a full backward
PASS_LABELS = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad", "FB": "forward+backward"}


def pass_color(kind: str) -> str:
    """The colour of a pass kind in those pictures (I lighter than B)."""
    return COLORS.get(kind, COLORS["B"]) if kind != "I" else "#7FBF8E"


HATCHES = {"schedule": "///", "imbalance": "...", "stage-wait": "...", "transfer": "xxx", "send": "\\\\\\",
           "gather": "---"}
LABELS = {"F": "forward", "B": "backward", "W": "weight grad", "FB": "forward+backward",
          "dense": "mixed actions too dense to split", "recompute": "recompute", "tp": "TP comm",
          "dp-comm": "DP grad reduce", "optimizer": "optimizer", "schedule": "idle: fill/drain",
          "imbalance": "idle: stage imbalance", "stage-wait": "idle: other stage", "transfer": "idle: transfer",
          "send": "idle: own send", "gather": "idle: chunk gather"}
LEGEND_ORDER = ("F", "B", "W", "FB", "dense", "recompute", "tp", "dp-comm", "optimizer", "schedule", "imbalance",
                "stage-wait", "transfer", "send", "gather")

LANE = 0.8  # lane height in rank units: the rest is the gap between lanes
LANE_IN = 0.42  # inches per lane before the height cap
TITLE_LINE_IN = 0.16  # inches per line of a panel's title
TITLE_CHARS = 170  # characters per title line that fit in WIDTH_IN at the title's size
MIN_LANE_IN = 0.12  # the least lane height the height cap may squeeze a lane to
GAP_IN = 0.1  # inches between one panel's lanes and the next panel's title
AXIS_IN = 0.55  # inches below the last panel for the tick labels and the axis name
WIDTH_IN = 15.0
RASTER_DPI = 150  # PNG resolution; the pixel tests below are in these pixels
MAX_HEIGHT_IN = 12.0  # 1,800 pixels at RASTER_DPI
MAX_LANES = 24  # lanes in the whole picture; past it each panel shows a subset of its ranks
DENSE_PX = 3.0  # an action narrower than this is merged with its dense neighbours
EDGE_PX = 8.0  # a block narrower than this has no white edge: edges a few pixels apart beat into moiré
TEXT_PT = 7.0
LEGEND_COLUMNS = 7


def setup_text(result: SimulationResult) -> str:
    """What was simulated, from the resolved scenario (so a ``--set`` of the system shows)."""
    scenario, layout = result.scenario, result.layout
    system = scenario.cluster.system
    cp = f" x CP {layout.cp}" if layout.cp > 1 else ""
    return (f"{scenario.model.name} on {layout.devices:,} x {system.accelerator.name} ({system.name}), "
            f"TP {layout.tp}{cp} x PP {layout.pp} x DP {layout.dp}, {result.schedule.name}")


def _kind(item) -> str:
    return "FB" if isinstance(item, Overlapped) else ("B" if item.kind == "I" else item.kind)


def action_label(item) -> str:
    """What a drawn action is labelled with: its microbatch, or both of an overlapped pair's."""
    if isinstance(item, Overlapped):
        return f"{item.forward.microbatch}|{item.backward.microbatch}"
    return str(item.microbatch)


class _Layer:
    """Rectangles of one kind, collected over all lanes and drawn as one compound path."""

    def __init__(self) -> None:
        self.boxes: list[tuple[float, float, float, float]] = []  # x, y, width, height

    def add(self, spans, top: float, height: float) -> None:
        self.boxes.extend((x, top, w, height) for x, w in spans)

    def patch(self, **style) -> PathPatch:
        """All rectangles as one compound path: a hatch is then filled once, not once per rectangle."""
        b = np.asarray(self.boxes, dtype=float).reshape(-1, 4)
        x0, y0, x1, y1 = b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]
        verts = np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1),
                          np.stack([x0, y1], 1), np.stack([x0, y0], 1)], axis=1).reshape(-1, 2)
        codes = np.tile(np.array([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY],
                                 dtype=Path.code_type), len(b))
        return PathPatch(Path(verts, codes), **style)


def _lane_actions(timeline, rank: int, scale: float, px_per_unit: float, merged: dict, single: dict,
                  texts: list, y: float, labels_fit: bool) -> None:
    """Sort one lane's actions into single blocks (wide) and merged runs (dense)."""
    run: list = []  # (start, end, kind) of the dense actions being merged
    gap = 1.0 / px_per_unit  # one pixel in data units

    def close_run() -> None:
        if run:
            kinds = {kind for _, _, kind in run}
            merged[kinds.pop() if len(kinds) == 1 else "dense"].append((run[0][0], run[-1][1] - run[0][0]))
            run.clear()

    for record in timeline.actions[rank]:
        item = record.action
        start, end = record.start_s * scale, record.end_s * scale
        kind = _kind(item)
        if (end - start) * px_per_unit < DENSE_PX:
            if run and start - run[-1][1] > gap:
                close_run()
            run.append((start, end, kind))
            continue
        close_run()
        single[kind if (end - start) * px_per_unit >= EDGE_PX else "thin:" + kind].append((start, end - start))
        if labels_fit:
            label = action_label(item)
            # about 0.62 em per digit, plus a margin, in pixels at RASTER_DPI
            if (end - start) * px_per_unit > 0.62 * TEXT_PT * RASTER_DPI / 72 * len(label) + 4:
                texts.append((start + (end - start) / 2, y, label))
    close_run()


def _collect(result: SimulationResult, lanes: list[Lane], scale: float, px_per_unit: float, lane_px: float,
             reference: BubbleReference | None) -> tuple[dict[str, _Layer], list[tuple[float, float, str]]]:
    """The rectangles (by layer) and block labels of the chosen lanes of one result."""
    timeline = result.timeline
    gap = 1.0 / px_per_unit
    layers: dict[str, _Layer] = defaultdict(_Layer)
    texts: list[tuple[float, float, str]] = []
    labels_fit = lane_px * LANE >= 1.5 * TEXT_PT * RASTER_DPI / 72
    for y, lane in enumerate(lanes):
        rank, top = lane.rank, y - LANE / 2  # the y axis is inverted (rank 0 on top): top edge on screen
        waits = (reference.waits_before[rank], reference.drain_after[rank]) if reference is not None else None
        idle: dict[str, list] = defaultdict(list)
        for span in idle_intervals(timeline, rank, timeline.pipeline_end_s, waits):
            idle[span.kind].append((span.start_s * scale, (span.end_s - span.start_s) * scale))
        for kind, spans in idle.items():
            layers["idle:" + kind].add(_visible(merge_runs(spans, gap), px_per_unit), top, LANE)
        merged: dict[str, list] = defaultdict(list)
        single: dict[str, list] = defaultdict(list)
        _lane_actions(timeline, rank, scale, px_per_unit, merged, single, texts, y, labels_fit)
        for kind, spans in merged.items():
            layers["run:" + kind].add(merge_runs(spans, gap), top, LANE)
        for kind, spans in single.items():  # "thin:F" goes to the "thin" role, drawn without edges
            layers[kind if kind.startswith("thin:") else "block:" + kind].add(spans, top, LANE)
        strips: dict[str, list] = defaultdict(list)
        for record in timeline.actions[rank]:
            for segment in result.cost(record.action).segments:
                if segment.stream == "tp" or segment.category == "recompute":
                    key = "tp" if segment.stream == "tp" else "recompute"
                    strips[key].append(((record.start_s + segment.offset_s) * scale, segment.duration_s * scale))
        # a strip under a pixel wide would be a faint smudge: left out, and so out of the key
        layers["strip:recompute"].add(_visible(merge_runs(strips["recompute"], gap), px_per_unit), top, LANE * 0.2)
        layers["strip:tp"].add(_visible(merge_runs(strips["tp"], gap), px_per_unit), top + LANE * 0.8, LANE * 0.2)
        for sync in timeline.syncs_of(rank):
            span = [(sync.start_s * scale, (sync.end_s - sync.start_s) * scale)]
            if sync.kind == "optimizer":
                layers["sync:optimizer"].add(span, top, LANE)
            else:
                layers["sync:dp-comm"].add(span, top, LANE * 0.2)
    return {key: layer for key, layer in layers.items() if layer.boxes}, texts


def _drawn_kinds(layers: dict[str, _Layer]) -> set[str]:
    return {key.split(":", 1)[1] for key in layers}


def _render(ax, layers: dict[str, _Layer], texts: list[tuple[float, float, str]], lanes: list[Lane],
            lane_px: float) -> None:
    """Draw one panel's layers, labels and lane names."""
    for order, (role, kind) in enumerate(k.split(":", 1) for k in _layer_order(layers)):
        layer = layers[f"{role}:{kind}"]
        if role == "idle":
            style = {"facecolor": COLORS[kind], "edgecolor": "#BBBBBB", "hatch": HATCHES[kind], "linewidth": 0}
        elif role == "block":
            style = {"facecolor": COLORS[kind], "edgecolor": "white", "linewidth": 0.4}
        else:
            style = {"facecolor": COLORS[kind], "linewidth": 0}
        # add_artist, not add_patch: the limits are set below, and autoscaling walks every vertex
        ax.add_artist(layer.patch(zorder=1 + order / 100, gid=kind, **style))  # gid: the kind, kept in SVGs
    for x, y, label in texts:
        ax.text(x, y, label, ha="center", va="center", fontsize=TEXT_PT, color="white", zorder=3)
    skipped = [y + 0.5 for y in range(len(lanes) - 1) if lanes[y + 1].rank != lanes[y].rank + 1]
    for y in skipped:  # a dotted line where ranks were left out
        ax.axhline(y, color="#888888", linestyle=":", linewidth=0.8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([_lane_name(lane) for lane in lanes], fontsize=8 if lane_px >= 14 else 6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _lane_name(lane: Lane) -> str:
    return f"rank {lane.rank}" + (f" ({lane.role})" if lane.role else "")


def _visible(spans: list[tuple[float, float]], px_per_unit: float) -> list[tuple[float, float]]:
    """The spans at least a pixel wide."""
    return [span for span in spans if span[1] * px_per_unit >= 1.0]


def _layer_order(layers: dict) -> list[str]:
    """Idle underneath, then blocks and runs, then strips and syncs on top."""
    rank = {"idle": 0, "run": 1, "thin": 1, "block": 2, "strip": 3, "sync": 4}
    return sorted(layers, key=lambda key: (rank[key.split(":", 1)[0]], key))


def _lanes_note(lanes: list[Lane], total: int) -> str:
    if len(lanes) == total:
        return ""
    return (f"showing {len(lanes)} of {total} pipeline ranks: the first, the last, the busiest and evenly spaced "
            f"ones (dotted lines mark ranks left out)")


def plot_timelines(results: list[tuple[SimulationResult, Summary, str]], path: str,
                   references: list[BubbleReference | None] | None = None) -> None:
    """Draw one panel per (result, summary, label) on a shared time axis to ``path``.

    Each panel's title names what was simulated (model, devices, accelerator, system,
    layout, schedule) after the label, when one is given.
    """
    fig = timeline_figure(results, references)
    try:
        if path.lower().endswith(".png"):  # zlib level 3: a tenth larger than the default, half the time
            fig.savefig(path, dpi=RASTER_DPI, pil_kwargs={"compress_level": 3})
        else:
            fig.savefig(path, dpi=fig.dpi if path.endswith(".svg") else RASTER_DPI)
    finally:
        plt.close(fig)


def timeline_figure(results: list[tuple[SimulationResult, Summary, str]],
                    references: list[BubbleReference | None] | None = None):
    """The figure :func:`plot_timelines` saves (the caller closes it)."""
    references = references or [None] * len(results)
    longest = max(result.timeline.span_s for result, _, _ in results)
    scale, unit = (1.0, "s") if longest >= 1 else (1e3, "ms")
    per_panel = max(3, MAX_LANES // len(results))
    chosen = []
    for result, _, _ in results:
        busy = [sum(r.end_s - r.start_s for r in actions) for actions in result.timeline.actions]
        chosen.append(choose_ranks(busy, per_panel))
    titles = [_title(result, summary, label, lanes, scale, unit)
              for (result, summary, label), lanes in zip(results, chosen)]
    titles_in = [TITLE_LINE_IN * (title.count("\n") + 1) + 0.1 for title in titles]
    # the layout is computed, not measured (tight_layout measures every label: a third of the time)
    longest_name = max(len(_lane_name(lane)) for lanes in chosen for lane in lanes)
    left_in, right_in = 0.3 + 0.075 * longest_name, 0.2
    px_per_unit = (WIDTH_IN - left_in - right_in) * RASTER_DPI / (longest * scale * 1.005)
    lanes_in = [LANE_IN * len(lanes) for lanes in chosen]
    frame_in = sum(titles_in) + GAP_IN * len(results) + AXIS_IN
    natural_in = sum(lanes_in) + frame_in + _legend_in(len(LEGEND_ORDER))
    # lanes shrink to fit the cap, down to MIN_LANE_IN; only a compare of many schedules goes past it
    squeeze = max(MIN_LANE_IN / LANE_IN, min(1.0, (MAX_HEIGHT_IN - natural_in + sum(lanes_in)) / sum(lanes_in)))
    lane_px = LANE_IN * squeeze * RASTER_DPI
    collected = [_collect(result, lanes, scale, px_per_unit, lane_px, reference)
                 for (result, _, _), lanes, reference in zip(results, chosen, references)]
    handles = legend_handles(set().union(*(_drawn_kinds(layers) for layers, _ in collected)))
    legend_in = _legend_in(len(handles))
    height_in = legend_in + sum(lanes_in) * squeeze + frame_in
    fig = plt.figure(figsize=(WIDTH_IN, height_in))
    top = height_in - legend_in
    axes = []
    for lanes_height, title_in, (layers, texts), lanes in zip(lanes_in, titles_in, collected, chosen):
        top -= title_in
        box_in = lanes_height * squeeze
        ax = fig.add_axes((left_in / WIDTH_IN, (top - box_in) / height_in, 1 - (left_in + right_in) / WIDTH_IN,
                           box_in / height_in), sharex=axes[0] if axes else None)
        top -= box_in + GAP_IN
        _render(ax, layers, texts, lanes, lane_px)
        axes.append(ax)
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=8.5, loc="left")
        if ax is not axes[-1]:
            ax.tick_params(labelbottom=False)
    axes[-1].set_xlim(0, longest * scale * 1.005)
    axes[-1].set_xlabel(f"time ({unit}); numbers on blocks are microbatches (forward|backward for overlapped pairs)")
    fig.legend(handles=handles, loc="upper left", ncol=min(len(handles), LEGEND_COLUMNS), frameon=False, fontsize=8,
               bbox_to_anchor=(0.01, 1.0), handlelength=1.5)
    return fig


def _title(result: SimulationResult, summary: Summary, label: str, lanes: list[Lane], scale: float,
           unit: str) -> str:
    """A panel's title: what was simulated, its headline numbers, and which ranks are shown.

    Lines are kept under TITLE_CHARS characters so that no title runs past the picture.
    """
    memory = summary.peak_memory_bytes / 2**30
    head = f"{label}: {setup_text(result)}" if label else setup_text(result)
    # steps that overlap their neighbours: the step time is a long run's, the lanes one step alone
    alone = summary.step_time_s + summary.cross_step_overlap_s
    overlap = f" in a long run ({alone * scale:.4g} {unit} alone)" if summary.cross_step_overlap_s > 0 else ""
    numbers = (f"step {summary.step_time_s * scale:.4g} {unit}{overlap}, bubble {100 * summary.bubble_fraction:.1f} %, "
               f"MFU {100 * summary.mfu:.1f} %, peak memory {memory:.1f} GiB")
    lines = [f"{head}; {numbers}"] if len(head) + len(numbers) + 2 <= TITLE_CHARS else [head, numbers]
    note = _lanes_note(lanes, result.timeline.num_ranks)
    return "\n".join(lines + ([note] if note else []))


def _legend_in(entries: int) -> float:
    """Inches the key takes above the panels: a margin and one row per 7 entries."""
    return 0.25 + 0.22 * math.ceil(entries / LEGEND_COLUMNS)


def legend_handles(drawn: set[str]) -> list[Patch]:
    """One key entry per kind drawn, in a fixed order."""
    return [Patch(facecolor=COLORS[k], edgecolor="#BBBBBB" if k in HATCHES else COLORS[k], hatch=HATCHES.get(k),
                  label=LABELS[k]) for k in LEGEND_ORDER if k in drawn]


def plot_timeline(result: SimulationResult, summary: Summary, path: str, title: str | None = None,
                  reference: BubbleReference | None = None) -> None:
    """Draw one result's timeline to ``path`` (PNG, SVG or PDF, from the extension).

    The title names what was simulated; ``title``, when given, is put in front of it.
    """
    plot_timelines([(result, summary, title or "")], path, [reference])
