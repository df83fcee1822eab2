"""Arguments and helpers shared by several commands."""

from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and where to look, no usage block."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _count(text: str, least: int) -> int:
    from mpsim.specs.loader import MAX_INTEGER_DIGITS

    text = text.strip()
    if len(text.lstrip("+-")) > MAX_INTEGER_DIGITS:
        raise argparse.ArgumentTypeError(f"{text[:20]}... is out of range")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _count(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _count(text, 0)


def add_scenario_args(parser: argparse.ArgumentParser) -> None:
    """The scenario positional argument and repeatable ``--set FIELD=VALUE``."""
    parser.add_argument("scenario", help="scenario file (or the name of a shipped one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any field, e.g. --set parallel.tp=4 (repeatable)")


# namespace attribute -> (option as the user wrote it, a picture?) for every file a command writes
OUTPUT_OPTIONS = {
    "plot": ("--plot", True), "memory_plot": ("--memory-plot", True), "heatmap": ("--heatmap", True),
    "pareto": ("--pareto", True), "breakdown": ("--breakdown", True), "scaling": ("--scaling", True),
    "trace": ("--trace", False), "memory_snapshot": ("--memory-snapshot", False), "out": ("--out", False),
    "output": ("-o/--output", False),
}


def picture_formats() -> list[str]:
    """File extensions matplotlib can write."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output a command could not write: a folder, a missing
    folder, an unwritable one, or a picture format matplotlib lacks."""
    import os
    from pathlib import Path

    from mpsim.errors import InputError

    for attribute, (option, picture) in OUTPUT_OPTIONS.items():
        value = getattr(args, attribute, None)
        if not isinstance(value, str) or value == "-":
            continue
        path = Path(value)
        if not value.strip():
            raise InputError("an empty file name", field=option)
        if path.is_dir() or value.endswith(os.sep):
            raise InputError(f"{value} is a folder; give a file name inside it", field=option)
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise InputError(f"folder {folder} does not exist; create it or write elsewhere", field=option)
        if not os.access(folder, os.W_OK):
            raise InputError(f"folder {folder} is not writable", field=option)
        if picture:
            suffix = path.suffix.lower().lstrip(".")
            formats = picture_formats()
            if suffix not in formats:
                raise InputError(f"cannot draw a {'.' + suffix if suffix else 'file without an extension'}; "
                                 f"use one of {', '.join('.' + f for f in formats)}", field=option)


def schedule_list(text: str) -> list[str]:
    """``--schedules A,B,...``: names of registered schedules, at least one, each known; a typo
    is an error, not a silently smaller list."""
    import difflib

    from mpsim.errors import InputError
    from mpsim.schedules import SCHEDULES, canonical_name

    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise InputError("no schedule named; e.g. --schedules 1f1b,interleaved-1f1b", field="--schedules")
    if "" in parts:
        raise InputError(f"an empty name in {text!r}", field="--schedules")
    for name in parts:
        if canonical_name(name) not in SCHEDULES:
            close = difflib.get_close_matches(canonical_name(name), list(SCHEDULES), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(SCHEDULES)}"
            raise InputError(f"unknown schedule {name!r}; {hint}", field="--schedules")
    return parts


def no_layout_exit(records: list) -> int:
    """Exit code of a plan or sweep with no layout that ran and fits: out of memory (3) when
    some layout was valid but too big; an input error (one line naming the commonest reason)
    when every one was invalid."""
    from collections import Counter

    from mpsim.errors import EXIT_OUT_OF_MEMORY, InputError

    done = [r for r in records if r is not None]
    if any(r["status"] != "invalid" for r in done) or not done:
        return EXIT_OUT_OF_MEMORY
    reason, count = Counter(r.get("error", "") for r in done).most_common(1)[0]
    raise InputError(f"all {len(done):,} points are invalid; the commonest reason ({count:,}): {reason}")
