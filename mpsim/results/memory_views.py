"""Memory per device over the step, drawn one line per pipeline rank.

The lines come from the engine's timeline: activations are allocated when a forward
starts and freed when the backward that consumes them ends, and parameters that ZeRO-3
gathers come and go with the passes (``memory.memory_timeline``); model state, the other
buffers and reserved memory are the floor for the whole step. The same memory as a PyTorch memory snapshot is
written by ``mpsim/results/memory_snapshot.py``.

A plot of every rank of a deep pipeline would be a tangle, so past ``ALL_RANKS_UP_TO``
ranks it draws a few chosen ones (the first two, the middle one, the last two and the one
with the highest peak), says in its title which and why, and shades the band every rank
lies in. Labels sit in a column right of the plot, each joined to the end of its line and
moved apart so that no two overlap, whatever the number of ranks.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mpsim.results.memory import RankMemory, held_params, memory_timeline  # noqa: E402
from mpsim.simulate import SimulationResult  # noqa: E402

GiB = 2.0**30
ALL_RANKS_UP_TO = 8  # more ranks than this: draw the chosen few and the band of all
LABEL_FONT_PT = 8
LABEL_SPACING = 1.5  # label pitch in the right-hand column, in font heights


def chosen_ranks(memory: list[RankMemory]) -> dict[int, list[str]]:
    """The ranks a plot of a deep pipeline draws, each with why (in rank order)."""
    count = len(memory)
    roles: dict[int, list[str]] = {}
    busiest = max(range(count), key=lambda rank: memory[rank].peak_memory_bytes)
    for rank, role in ((0, "first"), (1, "second"), (count // 2, "middle"), (count - 2, "second to last"),
                       (count - 1, "last"), (busiest, "highest peak")):
        roles.setdefault(rank, []).append(role)
    return dict(sorted(roles.items()))


def spread_labels(wanted: list[float], pitch: float, low: float = 0.0, high: float = 1.0) -> list[float]:
    """Label heights as close to ``wanted`` as possible, at least ``pitch`` apart, within [low, high].

    Labels keep their order; when they do not fit at ``pitch`` the pitch shrinks to share
    the room evenly.
    """
    if not wanted:
        return []
    pitch = min(pitch, (high - low) / max(1, len(wanted) - 1))
    order = sorted(range(len(wanted)), key=lambda index: (wanted[index], index))
    placed = [min(max(wanted[index], low), high) for index in order]
    for k in range(1, len(placed)):  # upwards from the lowest
        placed[k] = max(placed[k], placed[k - 1] + pitch)
    placed[-1] = min(placed[-1], high)
    for k in range(len(placed) - 2, -1, -1):  # back down from the top where that ran over
        placed[k] = min(placed[k], placed[k + 1] - pitch)
    result = [0.0] * len(wanted)
    for k, index in enumerate(order):
        result[index] = placed[k]
    return result


def _rank_curve(result: SimulationResult, m: RankMemory) -> tuple[list[float], list[float]]:
    """(times in s, GiB on the device) of one rank as a step function to the end of the step."""
    resident = m.peak_memory_bytes - m.activations_peak_bytes - m.gathered_params_bytes
    points = memory_timeline(result.timeline, result.schedule, result.workload, result.layout, m.rank)
    times = [t for t, _ in points] + [result.timeline.span_s]
    values = [(resident + level) / GiB for _, level in points] + [(resident + points[-1][1]) / GiB]
    return times, values


def _band(curves: list[tuple[list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, lowest, highest) over every rank's step function, on the union of their change times."""
    grid = np.unique(np.concatenate([np.asarray(times) for times, _ in curves]))
    lowest = np.full(grid.shape, np.inf)
    highest = np.full(grid.shape, -np.inf)
    for times, values in curves:
        # the value in force at each grid time: the last change at or before it
        index = np.searchsorted(np.asarray(times), grid, side="right") - 1
        level = np.asarray(values)[np.clip(index, 0, len(values) - 1)]
        lowest, highest = np.minimum(lowest, level), np.maximum(highest, level)
    return grid, lowest, highest


def plot_memory(result: SimulationResult, memory: list[RankMemory], path: str, ranks: list[int] | None = None) -> None:
    """Memory per device over the step, one line per drawn rank, labelled in a column on the right."""
    count = len(memory)
    if ranks is not None:
        roles = {rank: [] for rank in sorted(ranks)}
    elif count <= ALL_RANKS_UP_TO:
        roles = {rank: [] for rank in range(count)}
    else:
        roles = chosen_ranks(memory)
    step = result.timeline.span_s
    scale, unit = (1.0, "s") if step >= 1 else (1e3, "ms")
    fig, ax = plt.subplots(figsize=(12, 5.8))
    fig.subplots_adjust(left=0.07, right=0.72, top=0.84, bottom=0.1)

    curves = {rank: _rank_curve(result, memory[rank]) for rank in (range(count) if len(roles) < count else roles)}
    if len(roles) < count:
        grid, lowest, highest = _band(list(curves.values()))
        ax.fill_between(grid * scale, lowest, highest, step="post", color="0.88", linewidth=0)
    colors = plt.get_cmap("tab10")
    labels: list[tuple[str, float, object]] = []  # (text, GiB where its line ends, color)
    for position, (rank, why) in enumerate(roles.items()):
        times, values = curves[rank]
        color = colors(position % 10)
        ax.step([t * scale for t in times], values, where="post", color=color, linewidth=1.4)
        peak = max(range(len(values)), key=values.__getitem__)
        ax.plot([times[peak] * scale], [values[peak]], "o", color=color, markersize=3.5)
        reason = f" ({', '.join(why)})" if why else ""
        labels.append((f"rank {rank}{reason}: peak {values[peak]:.1f} GiB", values[-1], color))
    capacity = memory[0].capacity_bytes / GiB
    ax.axhline(capacity, color="#C44E52", linestyle="--", linewidth=1)
    labels.append((f"capacity {capacity:.0f} GiB", capacity, "#C44E52"))

    top = max(capacity, max(m.peak_memory_bytes for m in memory) / GiB) * 1.1
    ax.set_xlim(0, step * scale)
    ax.set_ylim(0, top)
    axes_height_pt = ax.get_position().height * fig.get_figheight() * 72
    heights = spread_labels([y / top for _, y, _ in labels], LABEL_SPACING * LABEL_FONT_PT / axes_height_pt)
    for (text, y, color), height in zip(labels, heights):
        # a short leader from where the line leaves the plot to its label, which never crosses a label
        ax.plot([1.0, 1.006, 1.024], [y / top, y / top, height], transform=ax.transAxes, clip_on=False,
                color=color, linewidth=0.7)
        ax.text(1.03, height, text, transform=ax.transAxes, va="center", fontsize=LABEL_FONT_PT, color=color)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory per device (GiB)")
    if len(roles) < count:
        chosen = "chosen as labelled" if ranks is None else "as asked"
        shown = f"{len(roles)} of {count} pipeline ranks drawn ({chosen}); the grey band spans all {count}"
    else:
        shown = f"all {count} pipeline rank{'s' if count > 1 else ''} drawn"
    from mpsim.results.plot import setup_text  # the resolved setup, so that a --set of the system shows

    ax.set_title(f"{setup_text(result)}: memory per device over one step\n{shown}\nmodel state, buffers and "
                 f"reserved memory are the floor; activations rise with each forward and fall with its backward"
                 f"{', gathered ZeRO-3 parameters come and go' if held_params(result.layout) or result.layout.fsdp_gathering is not None else ''}"
                 f" (dot: each rank's peak)", fontsize=9, loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.savefig(path, dpi=150 if not path.endswith(".svg") else fig.dpi)
    plt.close(fig)
