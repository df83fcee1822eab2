"""The result of one simulated step as a notebook shows it, and the files it writes.

A :class:`Result` holds what the main path returned (the simulation, the bubble
reference run, the summary ``mpsim run`` prints) and adds only presentation: a compact
table for Jupyter (``_repr_html_``), markdown and plain text, a pandas data frame on
request, and the command's writers behind a check of the output path.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mpsim.errors import InputError

if TYPE_CHECKING:
    from mpsim.specs import Scenario

PANDAS_HINT = "pandas is needed for data frames: pip install pandas (or pip install \"mpsim[notebook]\")"


def writable_path(method: str, path: str | os.PathLike, picture: bool = False, argument: str = "path") -> str:
    """The path as text, refused in one line before any work when it cannot be written
    (:func:`mpsim.paths.check_writable`, the check the command line makes)."""
    from mpsim.paths import check_writable

    label = f"{method}({argument})"
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise InputError(f"expected a file name, got {path!r}", field=label)
    check_writable(text, label, picture)
    return text


@contextmanager
def writing(method: str):
    """A file that cannot be written (permissions, a full disk) as one line, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", field=f"{method}(path)") from None


def dataframe(rows: list[dict[str, Any]]) -> Any:
    try:
        import pandas
    except ImportError:
        raise InputError(PANDAS_HINT) from None
    return pandas.DataFrame(rows)


class Result:
    """One simulated step: ``summary`` (a :class:`mpsim.results.Summary`), ``timeline``, and writers of
    the files ``mpsim run`` writes. ``warning`` is the placement note the command prints, or None."""

    def __init__(self, simulation: Any, reference: Any, summary: Any, warning: str | None = None):
        self.simulation = simulation  # mpsim.simulate.SimulationResult: scenario, layout, schedule, costs
        self.reference = reference  # the bubble reference run that splits idle time by cause
        self.summary = summary
        self.warning = warning

    @property
    def scenario(self) -> Scenario:
        return self.simulation.scenario

    @property
    def timeline(self) -> Any:
        """The engine's :class:`mpsim.engine.Timeline`: every action, transfer and sync with its times."""
        return self.simulation.timeline

    def to_dict(self) -> dict[str, Any]:
        """The summary as the JSON object ``mpsim run --json`` prints (docs/json.md), equal to it:
        lists where the summary holds tuples, as JSON has them."""
        import json

        from mpsim.results import summary_dict

        return json.loads(json.dumps(summary_dict(self.summary)))

    def plot(self, path: str | os.PathLike) -> None:
        """The timeline picture of ``mpsim run --plot`` (.png, .svg, .pdf)."""
        from mpsim.results.plot import plot_timeline

        target = writable_path("plot", path, picture=True)
        with writing("plot"):
            plot_timeline(self.simulation, self.summary, target, reference=self.reference)

    def write_trace(self, path: str | os.PathLike, actions_only: bool = False, form: str = "auto") -> None:
        """The Chrome / Perfetto trace of ``mpsim run --trace`` (``.gz``: gzip). ``form`` is
        ``"auto"`` (the full trace unless it is past the size docs/traces.md gives, then the
        compact one, as the command does), ``"full"`` or ``"compact"``."""
        from mpsim.results.trace import chosen_mode, write_trace

        if form not in ("auto", "full", "compact"):
            raise InputError(f"expected auto, full or compact, got {form!r}", field="form")
        target = writable_path("write_trace", path)
        mode, _ = chosen_mode(self.simulation, ops=not actions_only, requested=form)
        with writing("write_trace"):
            write_trace(self.simulation, target, ops=not actions_only, reference=self.reference,
                        compact=mode == "compact")

    def write_report(self, path: str | os.PathLike) -> None:
        """The self-contained interactive HTML report of ``mpsim report`` / ``mpsim run --report``."""
        from mpsim.results.html import write_run_report

        target = writable_path("write_report", path)
        with writing("write_report"):
            write_run_report(target, self.simulation, self.summary, self.reference)

    def plot_memory(self, path: str | os.PathLike) -> None:
        """Memory per device over the step, as ``mpsim run --memory-plot`` draws it."""
        from mpsim.results.memory_views import plot_memory

        target = writable_path("plot_memory", path, picture=True)
        with writing("plot_memory"):
            plot_memory(self.simulation, self.summary.memory, target)

    def write_memory_snapshot(self, path: str | os.PathLike, rank: int = 0) -> None:
        """A PyTorch memory snapshot of one pipeline rank (``mpsim run --memory-snapshot``)."""
        from mpsim.results.memory_snapshot import write_memory_snapshot

        ranks = self.simulation.schedule.num_ranks
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
            raise InputError(f"must be a pipeline rank 0..{ranks - 1}, got {rank!r}", field="rank")
        target = writable_path("write_memory_snapshot", path)
        with writing("write_memory_snapshot"):
            write_memory_snapshot(self.simulation, self.summary.memory, rank, target)

    def to_dataframe(self) -> Any:
        """One row per pipeline rank: where its time went and what fills its memory (needs pandas)."""
        data = self.to_dict()
        rows = [{**time, **{key: value for key, value in memory.items() if key not in ("rank", "reserved_parts")}}
                for time, memory in zip(data["ranks"], data["memory"])]
        return dataframe(rows)

    def _rows(self) -> list[tuple[str, str]]:
        from mpsim.units import format_bytes, format_seconds

        s = self.summary
        step = s.step_time_s

        def share(seconds: float) -> str:
            return f"{format_seconds(seconds)} ({100 * seconds / step:.1f} %)" if step > 0 else format_seconds(seconds)

        comm = [("TP", s.exposed_tp_comm_s), ("CP", s.exposed_cp_comm_s), ("EP", s.exposed_ep_comm_s),
                ("PP", s.exposed_pp_comm_s), ("DP", s.exposed_dp_comm_s)]
        layout = f"TP {s.tp} x CP {s.cp} x PP {s.pp} x DP {s.dp}" if s.cp > 1 else f"TP {s.tp} x PP {s.pp} x DP {s.dp}"
        return [
            ("scenario", s.scenario),
            ("layout", f"{layout} on {s.devices} x {s.accelerator}; {s.schedule}, {s.num_microbatches} microbatches"),
            ("step time", format_seconds(step)),
            ("throughput", f"{s.throughput_per_s:,.0f} {s.throughput_unit}/s "
                           f"({s.throughput_per_s / s.devices:,.0f} per device)"),
            ("MFU", f"{100 * s.mfu:.1f} % (HFU {100 * s.hfu:.1f} %)"),
            ("bubble", f"{100 * s.bubble_fraction:.1f} % of the pipeline time"),
            ("exposed communication", ", ".join(f"{name} {share(seconds)}" for name, seconds in comm
                                                if seconds > 0 or name in ("TP", "PP", "DP"))),
            ("peak memory", f"{format_bytes(s.peak_memory_bytes)} of {format_bytes(s.capacity_bytes)}"
                            + ("  OUT OF MEMORY" if s.out_of_memory else "")),
        ]

    def _repr_html_(self) -> str:
        import html

        cells = "".join(f"<tr><th style=\"text-align:left\">{html.escape(name)}</th>"
                        f"<td style=\"text-align:left\">{_html_value(name, value)}</td></tr>"
                        for name, value in self._rows())
        return f"<table>{cells}</table>"

    def _repr_markdown_(self) -> str:
        rows = [f"| {name} | {value.replace('|', '/')} |" for name, value in self._rows()]
        return "\n".join(["| | |", "|---|---|", *rows])

    def __repr__(self) -> str:
        rows = self._rows()
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _html_value(name: str, value: str) -> str:
    import html

    text = html.escape(value)
    if name == "peak memory" and "OUT OF MEMORY" in value:
        return text.replace("OUT OF MEMORY", "<strong style=\"color:#c00\">OUT OF MEMORY</strong>")
    return text
