"""Measured and simulated timelines, one above the other, for every validated schedule.

For each schedule two panels share a time axis: the median measured step (every rank's
actions as PyTorch ran them, receives it blocked in hatched) and mpsim's simulated step
with the fitted profile. Blocks use the colours of ``mpsim.results.plot`` (forward,
backward, weight gradient, overlapped forward+backward) and carry their microbatch.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from mpsim.calibrate.check.measured import median_step  # noqa: E402
from mpsim.results.plot import PASS_LABELS, action_label, pass_color  # noqa: E402
from mpsim.schedules.actions import Overlapped  # noqa: E402

LANE = 0.8
KIND_LABELS = {**PASS_LABELS, "wait": "blocked in a receive"}


def _lane(ax, rank: int, spans: list[tuple[float, float, str, str]]) -> None:
    for start, duration, kind, label in spans:
        ax.broken_barh([(start, duration)], (rank - LANE / 2, LANE), facecolors=pass_color(kind), edgecolor="white",
                       linewidth=0.4)
        if duration > 0.02 * ax.get_xlim()[1]:
            ax.text(start + duration / 2, rank, label, ha="center", va="center", fontsize=6, color="white")


def _measured(ax, step, scale: float) -> None:
    for rank, actions in enumerate(step.actions):
        waits = [(a * scale, (b - a) * scale) for a, b in step.waits[rank] if b > a]
        if waits:
            ax.broken_barh(waits, (rank - LANE / 2, LANE), facecolors="#F4C7C3", edgecolor="#BBBBBB", hatch="xxx",
                           linewidth=0)
        _lane(ax, rank, [(a.start_s * scale, a.duration_s * scale, a.kind, str(a.microbatch)) for a in actions])


def _simulated(ax, result, scale: float) -> None:
    for rank, records in enumerate(result.timeline.actions):
        spans = []
        for record in records:
            item = record.action
            kind = "FB" if isinstance(item, Overlapped) else item.kind
            spans.append((record.start_s * scale, (record.end_s - record.start_s) * scale, kind, action_label(item)))
        _lane(ax, rank, spans)


def plot_validation(checks, path: str) -> None:
    """Write the measured-over-simulated picture of every schedule check to ``path``."""
    if not checks:
        return
    longest = max(max(c.measured_step_s, c.predicted_step_s) for c in checks)
    scale, unit = (1.0, "s") if longest >= 1 else (1e3, "ms")
    ranks = checks[0].result.timeline.num_ranks
    height = 0.9 + 0.35 * ranks
    fig, axes = plt.subplots(2 * len(checks), 1, figsize=(14, min(2 * len(checks) * height + 0.8, 60)), sharex=True,
                             squeeze=False)
    for index, check in enumerate(checks):
        measured_ax, simulated_ax = axes[2 * index, 0], axes[2 * index + 1, 0]
        for ax in (measured_ax, simulated_ax):
            ax.set_xlim(0, longest * scale * 1.01)
            ax.set_ylim(ranks - 0.5, -0.5)
            ax.set_yticks(range(ranks))
            ax.set_yticklabels([f"rank {r}" for r in range(ranks)], fontsize=7)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        _measured(measured_ax, median_step(check.steps), scale)
        _simulated(simulated_ax, check.result, scale)
        role = "held out" if check.held_out else "fitted on"
        measured_ax.set_title(f"{check.name} ({role}), measured: {check.measured_step_s * scale:.4g} {unit} "
                              f"(median of {len(check.steps)} steps)", fontsize=9, loc="left")
        simulated_ax.set_title(f"{check.name}, simulated: {check.predicted_step_s * scale:.4g} {unit} "
                               f"({check.error_pct:+.1f} %)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"time ({unit}) from the start of the step; numbers on blocks are microbatches")
    handles = [Patch(facecolor=pass_color(k), label=v) for k, v in KIND_LABELS.items() if k != "wait"]
    handles.append(Patch(facecolor="#F4C7C3", hatch="xxx", edgecolor="#BBBBBB", label=KIND_LABELS["wait"]))
    fig.legend(handles=handles, loc="upper left", ncol=len(handles), frameon=False, fontsize=8,
               bbox_to_anchor=(0.01, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=120)
    plt.close(fig)
