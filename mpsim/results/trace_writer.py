"""Trace events as compact rows, and the Chrome trace-event JSON written from them a row at a time.

A trace of a large job holds millions of events. Building a dict per event and handing
the whole list to ``json.dump`` takes a minute and a few gigabytes; here an event is a
plain tuple (``Row``; the few metadata events are dicts), its times are whole
nanoseconds, and each row is formatted straight into its JSON text and written in
chunks. Times are written in microseconds (the format's unit) as the exact decimal of
the nanosecond count, so a reader sees the same integers that were computed, and slices
that touch or nest still do.

A path ending in ``.gz`` is written gzip-compressed (Perfetto and chrome://tracing open
``.json.gz`` as is), with no file name or time stamp in the gzip header, so the same
trace gives the same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpsim.simulate import SimulationResult

# rows per write: large enough that the file calls cost nothing, small enough that the
# text of one chunk stays a few megabytes
_CHUNK_ROWS = 20_000
# gzip level 6 (zlib's default): on a compact trace, within a tenth of level 9's size in under
# half its time
_GZIP_LEVEL = 6


# A row is one trace event in the cheapest form Python builds (a plain tuple is several
# times faster to make than a named tuple or a dict, and a large trace has millions):
#   ("X", pid, tid, start_ns, end_ns, name, category, args or None)   a complete slice
#   ("C", pid, name, ts_ns, [(series, value), ...])                    a counter: from ts_ns on,
#       each series named has the value given (Perfetto draws one track per series, named
#       "<name> <series>"; a series not named keeps its value)
#   a dict                                                             written as it is (metadata)
#   a str                                                              an event already in JSON text
Row = tuple | dict | str


def us_text(ns: int) -> str:
    """Microseconds as JSON text, exact to the nanosecond: 1234567 ns is ``1234.567``."""
    if ns < 0:
        return "-" + us_text(-ns)
    whole, part = divmod(ns, 1000)
    return f"{whole}.{part:03d}" if part else str(whole)


def track_names(result: SimulationResult, thread_names: dict[int, str]) -> list[dict[str, Any]]:
    """Metadata naming one process per pipeline rank and its threads.

    The engine simulates one pipeline rank for its whole tensor-, context- and
    data-parallel group (they run the same work at the same times), so a process stands
    for that many GPUs and the name says so: a 3,072-GPU job is 64 processes, not 3,072.
    """
    layout, schedule = result.layout, result.schedule
    groups = [(name, size) for name, size in (("TP", layout.tp), ("CP", layout.cp), ("DP", layout.dp)) if size > 1]
    gpus = layout.tp * layout.cp * layout.dp
    stands_for = f"; stands for {' x '.join(f'{n} {s}' for n, s in groups)} = {gpus} GPUs" if gpus > 1 else ""
    events: list[dict[str, Any]] = []
    for rank in range(schedule.num_ranks):
        stages = ", ".join(str(s) for s, owner in enumerate(schedule.stage_to_rank) if owner == rank)
        events.append({"ph": "M", "name": "process_name", "pid": rank,
                       "args": {"name": f"pp rank {rank} (stage {stages}{stands_for})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for tid, name in thread_names.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    return events


def as_dict(row: Row) -> dict[str, Any]:
    """The event a JSON reader gets back for ``row`` (times as float microseconds)."""
    if isinstance(row, dict):
        return row
    if isinstance(row, str):
        return json.loads(row)
    if row[0] == "X":
        _, pid, tid, start, end, name, category, args = row
        event = {"ph": "X", "name": name, "cat": category, "pid": pid, "tid": tid,
                 "ts": start / 1e3, "dur": (end - start) / 1e3}
        if args is not None:
            event["args"] = args
        return event
    _, pid, name, ts, values = row
    return {"ph": "C", "name": name, "pid": pid, "ts": ts / 1e3, "args": dict(values)}


def _encoded(rows: Iterable[Row]) -> Iterator[str]:
    """The JSON text of each row. Written for speed, as one loop: the parts of a slice that
    repeat (its name and category: every forward of a stage, every op label) are quoted once."""
    tails: dict[tuple[str, str], str] = {}  # (name, category) -> their JSON and the closing brace
    quoted: dict[str, str] = {}
    dumps = json.dumps
    for row in rows:
        if type(row) is str:
            yield row
        elif isinstance(row, dict):
            yield dumps(row, separators=(",", ":"))
        elif row[0] == "X":
            _, pid, tid, start, end, name, category, args = row
            tail = tails.get((name, category))
            if tail is None:
                # letters and digits (an action's name, 0F3) need no escaping
                name_text = f'"{name}"' if name.isascii() and name.isalnum() else dumps(name)
                category_text = quoted.get(category)
                if category_text is None:
                    category_text = quoted[category] = dumps(category)
                tail = tails[name, category] = f',"name":{name_text},"cat":{category_text}}}'
            if args is not None:
                tail = f',"args":{dumps(args, separators=(",", ":"))}{tail}'
            duration = end - start
            # whole microseconds (the compact trace's times) take the short path
            ts = str(start // 1000) if start % 1000 == 0 else us_text(start)
            dur = str(duration // 1000) if duration % 1000 == 0 else us_text(duration)
            yield f'{{"ph":"X","pid":{pid},"tid":{tid},"ts":{ts},"dur":{dur}{tail}'
        else:
            _, pid, name, ts_ns, values = row
            head = quoted.get(name)
            if head is None:
                head = quoted[name] = f',"name":{dumps(name)},"args":{{'
            series = []
            for key, value in values:
                key_text = quoted.get(key)
                if key_text is None:
                    key_text = quoted[key] = dumps(key) + ":"
                series.append(key_text + repr(value))
            ts = str(ts_ns // 1000) if ts_ns % 1000 == 0 else us_text(ts_ns)
            yield f'{{"ph":"C","pid":{pid},"ts":{ts}{head}{",".join(series)}}}}}'


@contextmanager
def _open_text(path: str | os.PathLike) -> Iterator[io.TextIOBase]:
    """``path`` for writing text; gzip-compressed when it ends in ``.gz``."""
    if not os.fspath(path).lower().endswith(".gz"):
        with open(path, "w", encoding="utf-8") as handle:
            yield handle
        return
    with (open(path, "wb") as raw,
          gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=_GZIP_LEVEL, mtime=0) as compressed,
          io.TextIOWrapper(compressed, encoding="utf-8") as handle):
        yield handle


def write_rows(path: str | os.PathLike, rows: Iterable[Row]) -> None:
    """Write ``rows`` to ``path`` as a Chrome trace JSON object, one event a line."""
    with _open_text(path) as handle:
        handle.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        chunk: list[str] = []
        separator = ""
        for text in _encoded(rows):
            chunk.append(text)
            if len(chunk) >= _CHUNK_ROWS:
                handle.write(separator + ",\n".join(chunk))
                separator = ",\n"
                chunk.clear()
        if chunk:
            handle.write(separator + ",\n".join(chunk))
        handle.write("\n]}\n")
