"""Reports of sweeps and plans: every layout in one table, and the best one's step in full.

A sweep or a plan keeps one record per point (``mpsim/explore``: the point's fields, a
status and the metrics of its summary). The report lists the records as a table, best
first, out-of-memory layouts marked and never chosen as the best, draws throughput
against peak memory with the device's capacity, and simulates the best layout that fits
once more to show its timeline, bubble and memory like ``mpsim report`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from mpsim.results.html import layout_table, write_report

MAX_ROWS = 2000  # rows in the table; the note says how many were left out
METRICS = (("step_time_s", "step time", "time"), ("throughput_per_s", "throughput", "number"),
           ("mfu", "MFU", "percent"), ("bubble_fraction", "bubble", "percent"),
           ("peak_memory_bytes", "peak memory", "bytes"), ("status", "status", "text"), ("error", "why not", "text"))


def _out_of_memory(record: dict[str, Any]) -> bool:
    return record["status"] == "oom" or bool((record.get("metrics") or {}).get("out_of_memory"))


def _fits(record: dict[str, Any]) -> bool:
    return record["status"] == "ok" and not _out_of_memory(record)


def _fitting_first(records: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Finished records, the simulated ones that fit first (fastest first), then the others."""
    done = [r for r in records if r is not None]
    fitting = sorted((r for r in done if _fits(r)), key=lambda r: r["metrics"]["step_time_s"])
    return fitting + [r for r in done if not _fits(r)]


def records_rows(records: Sequence[dict[str, Any] | None], fields: Sequence[str]) -> list[dict[str, Any]]:
    """One row per finished record: its fields by their short names, its metrics, status and
    error; simulated layouts that fit first (fastest first), then the others."""
    rows = []
    for record in _fitting_first(records):
        metrics = record.get("metrics") or {}
        row = {name: record["point"].get(name) for name in fields}
        row.update({key: metrics.get(key) for key, _, _ in METRICS[:5]})
        row.update(status="out of memory" if _out_of_memory(record) else record["status"],
                   error=record.get("error"), out_of_memory=_out_of_memory(record))
        for name in fields:
            if isinstance(row[name], (list, dict)):
                row[name] = str(row[name])
        rows.append(row)
    return rows


def write_records_report(path: str | Path, title: str, subtitle: str, records: Sequence[dict[str, Any] | None],
                         fields: Sequence[str], best_run: Callable[[dict[str, Any]], tuple] | None,
                         counts_note: str = "") -> None:
    """The report of a sweep or plan. ``best_run(point)`` simulates a point and returns
    (result, summary, bubble reference); it is called for the fastest layout that fits."""
    rows = records_rows(records, fields)
    shown = rows[:MAX_ROWS]
    capacity = next((r["metrics"].get("capacity_bytes") for r in records
                     if r is not None and (r.get("metrics") or {}).get("capacity_bytes")), None)
    unit = next((r["metrics"].get("throughput_unit") for r in records
                 if r is not None and (r.get("metrics") or {}).get("throughput_unit")), "tokens")
    columns = [(name, name.rsplit(".", 1)[-1], "text") for name in fields]
    columns += [(key, f"{label} ({unit}/s)" if key == "throughput_per_s" else label, fmt) for key, label, fmt in METRICS]
    note = ("Simulated layouts that fit come first, fastest first (the best in bold); out-of-memory layouts are "
            "marked in red and never chosen. " + counts_note
            + (f" The first {MAX_ROWS:,} of {len(rows):,} rows are shown." if len(rows) > MAX_ROWS else ""))
    table = layout_table(shown, columns, "Layouts", note.strip(),
                         scatter={"x": "peak_memory_bytes", "y": "throughput_per_s",
                                  "x_label": "peak memory per device", "y_label": f"throughput ({unit}/s)",
                                  "capacity": capacity})
    runs = []
    ordered = _fitting_first(records)
    best = ordered[0] if ordered and _fits(ordered[0]) else None
    if best is not None and best_run is not None:
        result, summary, reference = best_run(best["point"])
        runs.append((result, summary, reference, f"best layout: {summary.scenario}"))
    write_report(path, runs, title, subtitle, table=table)
