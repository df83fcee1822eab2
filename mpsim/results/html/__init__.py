"""One self-contained HTML report per result: summary, interactive timeline, bubble, memory.

``mpsim report SCENARIO -o report.html`` (and ``--report FILE`` on run, compare, sweep and
plan) writes a single file that opens in any browser without network access. The Python
side only gathers data (:mod:`mpsim.results.html.payload`) and inlines it with the page's
script and stylesheet (:mod:`mpsim.results.html.page`); everything drawn is drawn by the
scripts in ``assets/`` on canvases, so a timeline of 100,000 actions stays smooth
when zoomed and panned: each frame walks only the visible actions of each rank and draws
a pixel column once however many actions fall in it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mpsim.results.html.page import render_page
from mpsim.results.html.payload import legend, run_payload
from mpsim.results.metrics import Summary
from mpsim.simulate import BubbleReference, SimulationResult


def _subtitle(summary: Summary, schedule: bool = True) -> str:
    return (f"{summary.devices:,} x {summary.accelerator} ({summary.system}) · TP {summary.tp} · CP {summary.cp} · "
            f"PP {summary.pp} · DP {summary.dp}" + (f" · {summary.schedule}" if schedule else ""))


def write_report(path: str | Path, runs: Sequence[tuple[SimulationResult, Summary, BubbleReference | None, str]],
                 title: str, subtitle: str | None = None, table: dict[str, Any] | None = None) -> None:
    """Write the report of ``runs`` (result, summary, bubble reference, title) and an optional
    table of layouts (``columns``: key/label/format, ``rows`` with ``oom`` and ``best``, ``scatter``)."""
    payload = {"title": title, "legend": legend(),
               "subtitle": subtitle if subtitle is not None else (_subtitle(runs[0][1]) if runs else ""),
               "runs": [run_payload(result, summary, reference, name) for result, summary, reference, name in runs]}
    if table is not None:
        payload["table"] = table
    Path(path).write_text(render_page(payload), encoding="utf-8")


def write_run_report(path: str | Path, result: SimulationResult, summary: Summary,
                     reference: BubbleReference | None) -> None:
    """The report of one simulated step."""
    write_report(path, [(result, summary, reference, summary.scenario)], f"{summary.scenario}: one training step")


def layout_table(rows: list[dict[str, Any]], columns: Sequence[tuple[str, str, str]], heading: str, note: str,
                 step_key: str = "step_time_s", scatter: dict[str, Any] | None = None) -> dict[str, Any]:
    """A table of layouts or schedules for the report: ``columns`` are (key, label, format:
    time | bytes | percent | number | text); each row is marked ``oom`` from its
    ``out_of_memory`` field, and the fastest row that fits is marked ``best``."""
    marked = [dict(row, oom=bool(row.get("out_of_memory"))) for row in rows]
    fitting = [row for row in marked if not row["oom"] and isinstance(row.get(step_key), (int, float))]
    if fitting:
        min(fitting, key=lambda row: row[step_key])["best"] = True
    table = {"heading": heading, "note": note, "rows": marked,
             "columns": [{"key": key, "label": label, "format": fmt} for key, label, fmt in columns]}
    if scatter is not None:
        table["scatter"] = scatter
    return table


COMPARE_COLUMNS = (("schedule", "schedule", "text"), ("vpp", "chunks per rank", "number"),
                   ("step_time_s", "step time", "time"), ("bubble_fraction", "bubble", "percent"),
                   ("bubble_rate_zb", "bubble rate (ZB paper)", "percent"),
                   ("bubble_imbalance_s", "stage imbalance", "time"), ("exposed_pp_comm_s", "exposed PP comm", "time"),
                   ("mfu", "MFU", "percent"), ("peak_memory_bytes", "peak memory", "bytes"), ("error", "why not", "text"))


def write_compare_report(path: str | Path, scenario: str,
                         runs: Sequence[tuple[SimulationResult, Summary, BubbleReference | None, str]],
                         rows: list[dict[str, Any]]) -> None:
    """The report of ``mpsim compare``: the schedules side by side, each one's timeline on request."""
    capacity = runs[0][1].capacity_bytes if runs else None
    table = layout_table(rows, COMPARE_COLUMNS, "Schedules side by side",
                         "Out-of-memory schedules are marked in red and never chosen as the best (bold).",
                         scatter={"x": "peak_memory_bytes", "y": "mfu", "x_label": "peak memory per device",
                                  "y_label": "MFU", "capacity": capacity})
    subtitle = _subtitle(runs[0][1], schedule=False) if runs else ""
    write_report(path, runs, f"{scenario}: schedules compared", subtitle, table=table)
