"""Progress of a measurement job, from the workers to the ``mpsim`` process that waits for them.

A calibration or validation job runs for minutes in worker processes whose output goes
to log files. Rank 0 appends one line per step of a phase to ``progress.txt`` in the
job's folder (:class:`ProgressWriter`): which phase, how far (``op pass 2 of 5``),
how many things it measures. The parent polls the file while it waits
(:class:`ProgressReader`) and passes each new complete line on, prefixed with the
time since the job started, to stderr. Only rank 0 writes: the ranks run in lock step,
so its progress is the job's.
"""

from __future__ import annotations

from pathlib import Path

PROGRESS_FILE = "progress.txt"


class ProgressWriter:
    """Appends progress lines to the job's progress file (rank 0), or does nothing (other ranks)."""

    def __init__(self, folder: str | Path | None, rank: int):
        self.path = Path(folder) / PROGRESS_FILE if folder is not None and rank == 0 else None

    def __call__(self, text: str) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as out:  # one write per line, flushed on close: the reader sees whole lines
            out.write(" ".join(text.split()) + "\n")


class ProgressReader:
    """Reads the lines added to a progress file since the last call."""

    def __init__(self, folder: Path):
        self.path = folder / PROGRESS_FILE
        self.offset = 0

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as source:
                source.seek(self.offset)
                data = source.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self.offset += len(complete)
        return [line for line in complete.decode(errors="replace").splitlines() if line]
