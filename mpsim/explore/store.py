"""The results file: one JSON object per line, appended as points finish.

Each line is a record of one point (format in docs/explore.md)::

    {"key": "3f0c...", "status": "ok", "point": {"parallel.tp": 4}, "error": null, "metrics": {...}}

``key`` is a stable hash of everything that defines the point: the base (scenario file
name and content, or the planner's model/cluster/devices), the base ``--set`` overrides
and the point's own overrides with their values as resolved (``2^0..3`` becomes 1, 2,
4, 8). Rerunning a sweep reads the file, keeps every record whose key it still asks
for and computes only the rest, so an interrupted sweep resumes where it stopped.

A line cut short by a crash is ignored on reading, and the next append starts on a
fresh line. When a key appears twice (a point recomputed with ``--retry-failed``), the
last record wins.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from mpsim.errors import InputError

RECORD_VERSION = 1
KEY_HEX_CHARS = 20  # 80 bits: no collisions among any sweep anyone will run


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def stable_key(identity: Any, point: Iterable[tuple[str, Any]]) -> str:
    """Hash of the base identity and the point's resolved overrides (sorted by field)."""
    return KeyMaker(identity)(point)


class KeyMaker:
    """``stable_key`` for many points of one identity: the text around the point is made once.

    The canonical JSON of ``{"base": identity, "point": [...], "v": RECORD_VERSION}`` is its
    keys in sorted order, so the point's part can be spliced between a fixed head and tail
    (``tests/test_explore_sweep.py`` holds it to the whole-object encoding)."""

    def __init__(self, identity: Any):
        self.head = '{"base":' + canonical_json(identity) + ',"point":'
        self.tail = ',"v":' + canonical_json(RECORD_VERSION) + "}"

    def __call__(self, point: Iterable[tuple[str, Any]]) -> str:
        text = self.head + canonical_json(sorted([k, v] for k, v in point)) + self.tail
        return hashlib.sha256(text.encode()).hexdigest()[:KEY_HEX_CHARS]


def file_digest(path: Path) -> str:
    """Content hash of a file, so editing the scenario invalidates its old results."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:KEY_HEX_CHARS]


class ResultsFile:
    """Append-only JSON-lines results, read back by key."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise InputError("results file is not a regular file", str(path))
        self._handle = None

    def load(self) -> dict[str, dict]:
        """Every complete record in the file by key (the last one wins)."""
        records: dict[str, dict] = {}
        if not self.path.is_file():
            return records
        with self.path.open("r", encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by an interrupted write
                if isinstance(record, dict) and isinstance(record.get("key"), str):
                    records[record["key"]] = record
        return records

    def _open(self):
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = False
            if self.path.is_file() and self.path.stat().st_size:
                with self.path.open("rb") as check:
                    check.seek(-1, 2)
                    needs_newline = check.read(1) != b"\n"
            try:
                self._handle = self.path.open("a", encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot write results: {exc.strerror}", str(self.path)) from None
            if needs_newline:
                self._handle.write("\n")  # finish a line an interrupted run left half written
        return self._handle

    def append(self, record: dict) -> None:
        """Write one record and flush it, so a crash loses nothing already computed."""
        handle = self._open()
        handle.write(canonical_json(record) + "\n")
        handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
