"""Plain-text tables for the terminal: aligned columns, numbers right, words left.

No colours and no box drawing, so tables survive pipes, logs and copy-paste.
"""

from __future__ import annotations

from typing import Any, Sequence

from mpsim.units import format_bytes, format_seconds


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> str:
    """Columns padded to their widest cell; a column is right-aligned when its cells look numeric."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def numeric(i: int) -> bool:
        values = [row[i] for row in cells if row[i] not in ("", "-")]
        return bool(values) and all(_looks_numeric(v) for v in values)

    right = [numeric(i) for i in range(len(headers))]

    def line(parts: Sequence[str]) -> str:
        padded = [p.rjust(w) if r else p.ljust(w) for p, w, r in zip(parts, widths, right)]
        return (indent + "  ".join(padded)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _looks_numeric(text: str) -> bool:
    head = text.split(" ", 1)[0].rstrip("%kMGTx").lstrip("#")
    try:
        float(head.replace(",", ""))
    except ValueError:
        return False
    return True


def fmt_seconds(value: float | None) -> str:
    return "-" if value is None else format_seconds(value)


def fmt_bytes(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)


def fmt_percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def fmt_rate(value: float | None) -> str:
    """A rate (tokens, images, samples per second) with a k/M suffix."""
    if value is None:
        return "-"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}" if value / scale < 100 else f"{value / scale:.0f}{suffix}"
    return f"{value:.3g}"


def fmt_count(value: int) -> str:
    return f"{value:,}"
