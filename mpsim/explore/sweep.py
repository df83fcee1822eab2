"""What-if sweeps over a scenario file: axes in, one record per point out.

``run_sweep`` reads the file's ``sweep:`` block, adds the command line's ``--sweep`` and
``--zip`` axes, expands the grid, and evaluates every point through ``runner.run_points``
with a :class:`~mpsim.explore.evaluate.SweepEvaluator`. ``format_sweep`` prints the
records as a table in point order (or sorted by a metric).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mpsim.errors import InputError
from mpsim.explore.axes import Axis, Point, expand
from mpsim.explore.evaluate import SweepEvaluator
from mpsim.explore.pools import Session
from mpsim.explore.runner import RunControl, RunReport, keep_unless_failed, run_points
from mpsim.explore.store import file_digest
from mpsim.explore.sweepfile import merge_axes, read_sweep, scenario_file
from mpsim.explore.tables import fmt_bytes, fmt_percent, fmt_rate, fmt_seconds, render_table
from mpsim.paths import display_path
from mpsim.results.throughput import rate_heading, record_rate

MAX_POINTS = 100_000  # a grid larger than this is almost always a typo in a range
SORT_KEYS = {"tokens_per_s": True, "mfu": True, "step_time_s": False, "peak_memory_bytes": False}  # True: higher first


@dataclass
class SweepResult:
    """The axes, the points in order and what the run did."""

    scenario: str
    axes: list[Axis]
    points: list[Point]
    report: RunReport



def short_note(note: str, width: int = 160) -> str:
    """A failed point's note for the table: whole when short, else cut at a word with " ..."
    (the results file, --csv and --json keep all of it)."""
    if len(note) <= width:
        return note
    cut = note.rfind(" ", 0, width - 4)
    return note[:cut if cut > 0 else width - 4] + " ..."

def sweep_points(scenario: str, grid: Sequence[str] = (), zip_: Sequence[str] = ()) -> tuple[list[Axis], list[Point]]:
    """The axes and points of a sweep (file block plus command line)."""
    file = scenario_file(scenario)
    axes = merge_axes(read_sweep(file), list(grid), list(zip_))
    if not axes:
        raise InputError("nothing to sweep: give --sweep FIELD=VALUES (or --zip), or a sweep: block in the file",
                         display_path(file))
    size = 1
    for axis in axes:
        size *= max(1, len(axis))
    if size > MAX_POINTS:
        raise InputError(f"the sweep has {size:,} points (more than {MAX_POINTS:,}); narrow a range", "--sweep")
    return axes, expand(axes)


def check_swept_fields(scenario: str, axes, overrides: Sequence[str] = ()) -> None:
    """A swept field the scenario has no such field for is a typo in the sweep: one line
    naming ``--sweep`` before any point runs (a value a point cannot take stays that point's
    "invalid")."""
    from mpsim.explore.axes import override_text
    from mpsim.specs import load_scenario

    for axis in axes:
        for index, name in enumerate(axis.fields):
            try:
                load_scenario(scenario, [*overrides, override_text(name, axis.values[0][index])])
            except InputError as exc:
                if exc.message.startswith("unknown field"):
                    raise InputError(exc.message, f"--sweep {name}") from None


def run_sweep(scenario: str, grid: Sequence[str] = (), zip_: Sequence[str] = (), overrides: Sequence[str] = (), *,
              engine: str = "fast", backend: str = "local", workers: int | None = None,
              ray_address: str | None = None, out: str | None = None, limit: int | None = None,
              should_stop: Callable[[int], bool] | None = None, progress: bool | None = None,
              retry_failed: bool = False) -> SweepResult:
    """Evaluate every point of the sweep; records already in ``out`` are reused."""
    axes, points = sweep_points(scenario, grid, zip_)
    check_swept_fields(scenario, axes, overrides)
    file = scenario_file(scenario)
    identity = {"scenario": display_path(file), "content": file_digest(file), "set": list(overrides)}
    evaluator = SweepEvaluator(str(file), tuple(overrides), engine, identity)
    control = RunControl(out=out, reuse=keep_unless_failed if retry_failed else None, limit=limit,
                         should_stop=should_stop, progress=progress, label="sweep")
    with Session(backend, workers, ray_address) as session:
        report = run_points(evaluator, points, session, control)
    return SweepResult(display_path(file), axes, points, report)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def sweep_rows(result: SweepResult, sort: str | None = None, top: int | None = None) -> list[dict]:
    """The records to show, in point order or best first by ``sort``."""
    rows = [r for r in result.report.records if r is not None]
    if sort is not None:
        if sort not in SORT_KEYS:
            raise InputError(f"unknown metric {sort!r}; sort by one of {', '.join(SORT_KEYS)}", "--sort")
        higher = SORT_KEYS[sort]
        ok = [r for r in rows if r["status"] == "ok"]
        ok.sort(key=lambda r: -r["metrics"][sort] if higher else r["metrics"][sort])
        rows = ok + [r for r in rows if r["status"] != "ok"]
    return rows[:top] if top else rows


def format_sweep(result: SweepResult, sort: str | None = None, top: int | None = None) -> str:
    """The table ``mpsim sweep`` prints, and a line of counts."""
    fields = [name for axis in result.axes for name in axis.fields]
    short = [name.rsplit(".", 1)[-1] for name in fields]
    if len(set(short)) < len(short):
        short = fields
    body, units = [], []
    for record in sweep_rows(result, sort, top):
        m = record.get("metrics") or {}
        values = [_value(record["point"].get(name, "-")) for name in fields]
        if record["status"] == "ok":
            rate, unit = record_rate(m)
            units.append(unit)
            body.append(values + [fmt_seconds(m["step_time_s"]), fmt_rate(rate), fmt_percent(m["mfu"]),
                                  fmt_percent(m["bubble_fraction"]), fmt_bytes(m["peak_memory_bytes"]),
                                  "OOM" if m.get("out_of_memory") else "yes", ""])
        else:
            error = record.get("error") or ""
            prefix = f"{result.scenario}: "
            note = f"{record['status']}: {error[len(prefix):] if error.startswith(prefix) else error}"
            body.append(values + ["-", "-", "-", "-", "-", "-", short_note(note)])
    table = render_table(short + ["step", rate_heading(units), "MFU", "bubble", "peak memory", "fits", "note"], body)
    return table + "\n" + summary_line(result)


def summary_line(result: SweepResult) -> str:
    """``24 points: 20 simulated (2 out of memory), 3 invalid (skipped), 1 failed; ...``."""
    report = result.report
    done = report.done()
    ok = [r for r in done if r["status"] == "ok"]
    oom = sum(1 for r in ok if r["metrics"].get("out_of_memory"))
    invalid = sum(1 for r in done if r["status"] == "invalid")
    failed = sum(1 for r in done if r["status"] == "error")
    text = (f"{len(result.points)} points: {len(ok)} simulated ({oom} out of memory), {invalid} invalid (skipped), "
            f"{failed} failed; {report.computed} computed")
    if report.computed:
        plural = "s" if report.workers != 1 else ""
        text += f" in {report.elapsed_s:.1f} s on {report.workers} {report.backend} worker{plural}"
    text += f", {report.reused} reused from the results file"
    missing = len(result.points) - len(done)
    if missing:
        text += f"; {missing} not computed yet (rerun with the same --out to continue)"
    return text
