"""Pictures of a sweep or a plan, labelled in place so nobody has to hunt a legend.

* ``heatmap``: a metric over two swept fields; every cell carries its value, or why it
  has none (out of memory, hatched; invalid);
* ``pareto``: throughput against peak memory; the front, over the layouts that fit only,
  is drawn and each point on it named; layouts that do not fit are grey crosses, the
  device's capacity a labelled line;
* ``scaling``: throughput against device count, one line per system, named at its end,
  with the ideal (linear from the smallest run) dashed and each point's efficiency;
  layouts that do not fit are grey crosses off the lines;
* ``breakdown``: stacked bars of the step time of the best layouts (compute, exposed TP,
  PP and DP communication, bubble, optimizer), each segment named inside the bar; a
  layout that does not fit is hatched and says OOM.

Throughput is in the model's unit (``mpsim/results/throughput.py``): tokens/s, images/s,
samples/s or audio seconds/s. All take records (``store.py`` format) and a path; the
format follows the suffix.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

from mpsim.errors import InputError
from mpsim.explore.evaluate import BREAKDOWN
from mpsim.explore.tables import fmt_rate
from mpsim.results.throughput import rate_heading, record_rate

GIB = 2.0 ** 30
COLORS = {"compute": "#4878a8", "TP comm": "#d1495b", "PP comm": "#edae49", "bubble": "#b8b8b8",
          "DP comm": "#8f5fa8", "optimizer": "#66a182"}


def _pyplot():
    import logging

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the log axes' tick labels look for a STIX font for a glyph and fall back to DejaVu Sans,
    # with a warning line per label on stderr that says nothing about the picture
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    return plt


def _save(fig: Any, path: str | Path) -> None:
    path = Path(path)
    try:
        fig.savefig(path, dpi=130, bbox_inches="tight")
    except (ValueError, OSError) as exc:
        raise InputError(f"cannot write the picture: {exc}", str(path)) from None
    finally:
        _pyplot().close(fig)


def _ok(records: Sequence[dict | None]) -> list[dict]:
    return [r for r in records if r is not None and r["status"] == "ok"]


# the reason an empty heatmap cell shows, first of those its layouts have
CELL_REASONS = ("bound", "dominated", "error", "failed", "OOM", "invalid")


def empty_cell_reason(found: set[str]) -> str:
    """What a heatmap cell without a value says, from the statuses of its layouts: OOM only
    when none of those that could run fits, else the first of ``CELL_REASONS`` among them."""
    return next((reason for reason in CELL_REASONS if reason in found), min(found))


def out_of_memory(record: dict) -> bool:
    """True for a layout that does not fit: cut by the memory check, or simulated and over capacity."""
    return record["status"] == "oom" or bool((record.get("metrics") or {}).get("out_of_memory"))


def _fitting(records: Sequence[dict | None]) -> list[dict]:
    return [r for r in _ok(records) if not out_of_memory(r)]


def _cell_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def heatmap(records: Sequence[dict | None], x_field: str, y_field: str, path: str | Path,
            metric: str = "tokens_per_s", title: str | None = None) -> None:
    """Best ``metric`` per (x, y) cell over all other fields; empty cells say why."""
    plt = _pyplot()
    import numpy as np

    def value_of(record: dict, name: str) -> Any:
        if name in record["point"]:
            return record["point"][name]
        return (record.get("metrics") or {}).get(name.rsplit(".", 1)[-1])

    def metric_of(m: dict) -> Any:
        # tokens_per_s is the throughput: shown in the model's own unit (images/s of a ViT)
        return record_rate(m)[0] if metric == "tokens_per_s" and "tokens_per_s" in m else m.get(metric)

    # a point that was not simulated has no metrics, so no derived axis value (dp): it has no cell
    present = [r for r in records if r is not None
               and value_of(r, x_field) is not None and value_of(r, y_field) is not None]
    xs = sorted({value_of(r, x_field) for r in present}, key=_sort_key)
    ys = sorted({value_of(r, y_field) for r in present}, key=_sort_key)
    if not xs or not ys:
        raise InputError(f"the results have no values for {x_field} and {y_field}; pick two swept fields",
                         "--heatmap-axes")
    best: dict[tuple, float] = {}
    reasons: dict[tuple, set[str]] = {}
    for r in present:
        cell = (value_of(r, x_field), value_of(r, y_field))
        m = r.get("metrics") or {}
        if r["status"] == "ok" and not m.get("out_of_memory") and metric_of(m) is not None:
            best[cell] = max(best.get(cell, float("-inf")), metric_of(m))
        else:
            reasons.setdefault(cell, set()).add("OOM" if out_of_memory(r) else r["status"])
    # an empty cell is OOM only when none of its layouts fits; else the reason of one that
    # fits and was not run (a plan's bound, a lighter recompute that fits), then the others
    why = {cell: empty_cell_reason(found) for cell, found in reasons.items()}
    grid = np.full((len(ys), len(xs)), np.nan)
    for (x, y), v in best.items():
        grid[ys.index(y), xs.index(x)] = v
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(xs), 1.0 + 0.6 * len(ys)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    finite = grid[np.isfinite(grid)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for j, y in enumerate(ys):
        for i, x in enumerate(xs):
            v = grid[j, i]
            if np.isfinite(v):
                text = fmt_rate(v) if metric.startswith("tokens") else f"{v:.3g}"
                ax.text(i, j, text, ha="center", va="center", fontsize=9, color="white" if v < middle else "black")
            else:
                reason = why.get((x, y), "-")
                if reason == "OOM":  # a hatched cell: does not fit, whatever the other fields
                    ax.add_patch(plt.Rectangle((i - 0.5, j - 0.5), 1, 1, facecolor="#f2dede", edgecolor="#c9a0a0",
                                               hatch="//", linewidth=0))
                ax.text(i, j, reason, ha="center", va="center", fontsize=8, color="#555555")
    ax.set_xticks(range(len(xs)), [_cell_value(x) for x in xs])
    ax.set_yticks(range(len(ys)), [_cell_value(y) for y in ys])
    ax.set_xlabel(x_field)
    ax.set_ylabel(y_field)
    name = metric.replace("_", " ")
    if metric == "tokens_per_s":
        name = rate_heading(record_rate(r["metrics"])[1] for r in present if r["status"] == "ok")
    ax.set_title(title or f"{name} (best over the other fields; OOM: no layout fits)")
    if "bound" in why.values():  # a plan's cells whose layouts fit but could not beat the ones shown
        ax.text(0.5, -0.02, "bound: fits, but its lower bound on the step time is slower than the best shown "
                            "(not simulated)", transform=fig.transFigure, ha="center", va="bottom", fontsize=8,
                color="#555555")
    fig.colorbar(image, ax=ax, label=name)
    _save(fig, path)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both: lower memory (x) and higher throughput (y)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def pareto(records: Sequence[dict | None], path: str | Path, label: Callable[[dict], str] | None = None,
           title: str | None = None) -> list[dict]:
    """Throughput against peak memory with the front named; returns the records on the front.

    The front is computed over the layouts that fit only: a layout over the device's
    memory is no trade-off anyone can make. Those are drawn as grey crosses.
    """
    plt = _pyplot()
    simulated = _ok(records)
    rows = [r for r in simulated if not out_of_memory(r)]
    over = [r for r in simulated if out_of_memory(r)]
    if not simulated:
        raise InputError("no simulated point to draw", str(path))
    label = label or (lambda r: " ".join(f"{k.rsplit('.', 1)[-1]}={_cell_value(v)}" for k, v in r["point"].items()))
    point = lambda r: (r["metrics"]["peak_memory_bytes"] / GIB, record_rate(r["metrics"])[0])  # noqa: E731
    xy = [point(r) for r in rows]
    front = pareto_front(xy)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    if xy:
        ax.scatter([p[0] for p in xy], [p[1] for p in xy], s=14, color="#7a9cc6", zorder=1, label="fits")
    if over:
        ax.scatter([point(r)[0] for r in over], [point(r)[1] for r in over], s=18, marker="x", color="#b0b0b0",
                   zorder=1, label="out of memory (never on the front)")
    if front:
        fx, fy = [xy[i][0] for i in front], [xy[i][1] for i in front]
        ax.plot(fx, fy, "-o", color="#d1495b", markersize=5, zorder=2, label="front")
        for i in front[-8:]:  # the fastest end of the front is what people read
            ax.annotate(label(rows[i]), xy[i], xytext=(6, -3), textcoords="offset points", fontsize=7.5,
                        color="#8a1c2b")
    else:
        ax.text(0.5, 0.5, "no layout fits: no front", transform=ax.transAxes, ha="center", color="#8a1c2b")
    capacity = max(r["metrics"]["capacity_bytes"] for r in simulated) / GIB
    ax.axvline(capacity, color="black", linestyle=":", linewidth=1)
    ax.text(capacity, ax.get_ylim()[0], " device memory", rotation=90, va="bottom", ha="right", fontsize=8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # outside: no label under it
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel(rate_heading(record_rate(r["metrics"])[1] for r in simulated).replace("/s", " / s"))
    ax.set_title(title or "throughput against memory (red: the front of the layouts that fit; no point is both "
                          "faster and smaller)", fontsize=10)
    _save(fig, path)
    return [rows[i] for i in front]


def scaling(records: Sequence[dict | None], path: str | Path, title: str | None = None) -> None:
    """Throughput over device count, one line per system; ideal scaling dashed, efficiency at each point."""
    plt = _pyplot()
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for r in _fitting(records):
        m = r["metrics"]
        devices = m["devices"]
        series[m["system"]][devices] = max(series[m["system"]].get(devices, 0.0), record_rate(m)[0])
    over = [r["metrics"] for r in _ok(records) if out_of_memory(r)]
    if not series or all(len(s) < 2 for s in series.values()):
        raise InputError("a scaling curve needs simulated points at two or more device counts "
                         "(sweep cluster.nodes or cluster.num_devices)", str(path))
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for name, by_devices in sorted(series.items()):
        devices = sorted(by_devices)
        rates = [by_devices[d] for d in devices]
        line, = ax.plot(devices, rates, "-o", markersize=4)
        ideal = [rates[0] * d / devices[0] for d in devices]
        ax.plot(devices, ideal, "--", color=line.get_color(), linewidth=0.9, alpha=0.6)
        ax.annotate(f" {name}", (devices[-1], rates[-1]), color=line.get_color(), fontsize=9, va="center")
        ax.annotate(" ideal", (devices[-1], ideal[-1]), color=line.get_color(), fontsize=8, alpha=0.7,
                    va="center")
        for d, rate, perfect in zip(devices[1:], rates[1:], ideal[1:]):
            ax.annotate(f"{100 * rate / perfect:.0f}%", (d, rate), xytext=(0, -12), textcoords="offset points",
                        ha="center", fontsize=7.5, color=line.get_color())
    if over:  # greyed out, off the lines: a layout that does not fit has no throughput to scale
        ax.scatter([m["devices"] for m in over], [record_rate(m)[0] for m in over], marker="x", s=18,
                   color="#b0b0b0", label="out of memory")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    unit = rate_heading(record_rate(r["metrics"])[1] for r in _ok(records)).replace("/s", " / s")
    ax.set_ylabel(f"{unit} (best layout that fits at each size)")
    ax.set_title(title or "scaling (percentages: efficiency against linear from the smallest run)")
    _save(fig, path)


def breakdown(records: Sequence[dict], path: str | Path, label: Callable[[dict], str] | None = None,
              title: str | None = None) -> None:
    """Horizontal stacked bars of the step time of ``records`` (best first), segments named in place."""
    plt = _pyplot()
    rows = [r for r in records if r is not None and r["status"] == "ok"]
    if not rows:
        raise InputError("no simulated point to draw", str(path))
    label = label or (lambda r: " ".join(f"{k.rsplit('.', 1)[-1]}={_cell_value(v)}" for k, v in r["point"].items()))
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.55 * len(rows)))
    longest = max(r["metrics"]["step_time_s"] for r in rows)
    for y, r in enumerate(rows):
        m, left, narrow = r["metrics"], 0.0, []
        for key, name in BREAKDOWN:
            width = max(0.0, m.get(key, 0.0))
            if width <= 0:
                continue
            oom = out_of_memory(r)
            ax.barh(y, width, left=left, color=COLORS[name], edgecolor="white", height=0.7, alpha=0.45 if oom else 1,
                    hatch="//" if oom else None)
            if width > 0.1 * longest:  # wide enough to carry its name
                ax.text(left + width / 2, y, f"{name}\n{width:.2f} s", ha="center", va="center", fontsize=7,
                        color="white" if name in ("compute", "DP comm", "TP comm") else "black")
            else:  # too narrow: named after the bar instead
                narrow.append(f"{name} {width:.2f}")
            left += width
        note = f"  step {m['step_time_s']:.2f} s" + (f"  ({', '.join(narrow)})" if narrow else "")
        ax.text(max(left, m["step_time_s"]), y, note, va="center", fontsize=7.5)
    ax.set_yticks(range(len(rows)), [label(r) + (" (OOM)" if out_of_memory(r) else "") for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.45)
    for side in ("top", "right"):  # the notes after the bars may run past the axes: no frame to cross them
        ax.spines[side].set_visible(False)
    ax.set_xlabel("seconds per step (mean pipeline rank; narrow segments are named after the bar)")
    ax.set_title(title or "where the step time goes")
    _save(fig, path)
