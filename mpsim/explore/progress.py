"""A one-line progress bar with rate and ETA, on stderr.

It redraws at most a few times a second and only on a terminal (or when forced), so
logs and pipes stay clean. The ETA is the remaining count over the rate measured since
the first point finished, which skips the pool's start-up time.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_CHARS = 24
REDRAW_S = 0.2


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Counts finished points by status and draws ``label [####----] done/total rate ETA``."""

    def __init__(self, total: int, label: str = "sweep", enabled: bool | None = None, stream: TextIO | None = None):
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self.counts: dict[str, int] = {}
        self.started = time.monotonic()
        self.first_done: float | None = None
        self.last_draw = 0.0
        self.drawn = False

    def advance(self, status: str) -> None:
        now = time.monotonic()
        if self.first_done is None:
            self.first_done = now
        self.done += 1
        self.counts[status] = self.counts.get(status, 0) + 1
        if self.enabled and (now - self.last_draw >= REDRAW_S or self.done == self.total):
            self.draw(now)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        fraction = self.done / self.total if self.total else 1.0
        filled = int(round(BAR_CHARS * fraction))
        bar = "#" * filled + "-" * (BAR_CHARS - filled)
        text = f"{self.label} [{bar}] {self.done}/{self.total} {100 * fraction:3.0f}%"
        if self.first_done is not None and self.done > 1 and now > self.first_done:
            rate = (self.done - 1) / (now - self.first_done)
            text += f"  {rate:.1f}/s  ETA {format_duration((self.total - self.done) / rate)}"
        others = ", ".join(f"{name} {count}" for name, count in sorted(self.counts.items()) if name != "ok")
        return text + (f"  ({others})" if others else "")

    def draw(self, now: float | None = None) -> None:
        self.stream.write("\r" + self.line(now) + "\x1b[K")
        self.stream.flush()
        self.last_draw = time.monotonic()
        self.drawn = True

    def finish(self) -> None:
        if self.enabled and self.drawn:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()
