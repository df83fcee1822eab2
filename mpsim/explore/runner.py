"""Running many points: in this process, on all local cores, or on a Ray cluster.

One loop drives every backend. Points go out in chunks (a few per worker at a time,
so the queue stays short and an interrupt loses little); each finished chunk is counted
for the progress bar, and its records are appended to the results file in point order.
The order is fixed by the points, not by which worker finished first, so the same sweep
writes the same file. When the run stops early (a limit, a callback, Ctrl-C, an
exception), every record already computed is still written before returning.

Backends differ only in how a chunk reaches a worker (``pools.py``: in this process, a
pool of local processes, or Ray), and each runs the same function on it, so their
results are the same record for record.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from mpsim.explore.axes import Point
from mpsim.explore.pools import Chunk, Evaluator, Session
from mpsim.explore.progress import Progress
from mpsim.explore.store import KeyMaker, ResultsFile

MAX_CHUNK = 32
# a chunk kept whole for its group's shared work ends here anyway. A check chunk costs about
# 0.2 ms a layout, so this is a fraction of a second; the planner's groups stay whole (GPT-3
# 175B on 1,024 GPUs: 120 groups of up to 714 layouts; split at 256 their schedules and prices
# were made on both workers, 10 % more wall time in benchmarks/plan_speed.py)
MAX_GROUP_CHUNK = 1024


@dataclass
class RunReport:
    """What a run did. ``records`` follows the points; None where a point was not reached."""

    records: list[dict | None]
    computed: int = 0
    reused: int = 0
    stopped: bool = False
    elapsed_s: float = 0.0
    backend: str = "local"
    workers: int = 1

    def count(self, status: str) -> int:
        """Points with ``status`` among those computed or reused."""
        return sum(1 for r in self.records if r is not None and r["status"] == status)

    def done(self) -> list[dict]:
        return [r for r in self.records if r is not None]


def _chunks(todo: list[tuple[int, Point]], workers: int, group: Callable[[Point], Any] | None = None
            ) -> Iterator[Chunk]:
    """Consecutive points, a few chunks per worker; with ``group`` (the evaluator's ``chunk_group``)
    a chunk ends only where the group changes (or at ``MAX_GROUP_CHUNK``), so points that share
    work a worker caches (the planner: layouts that share schedules and stage shapes) go to one worker; a
    point whose group is None shares nothing."""
    size = max(1, min(MAX_CHUNK, math.ceil(len(todo) / (workers * 8)))) if workers > 1 else 1
    if group is None or workers <= 1:
        for start in range(0, len(todo), size):
            yield todo[start:start + size]
        return
    chunk: Chunk = []
    last: Any = None
    for item in todo:
        here = group(item[1])
        if chunk and (len(chunk) >= MAX_GROUP_CHUNK or (len(chunk) >= size and (here is None or here != last))):
            yield chunk
            chunk = []
        chunk.append(item)
        last = here
    if chunk:
        yield chunk


def _grouped(todo: list[tuple[int, Point]], group: Callable[[Point], Any]) -> list[tuple[int, Point]]:
    """The points with each group's together, the larger groups first, equal sizes in the order they
    first appear (points of group None count as groups of one, in their order): ``_chunks`` then
    gives each group to one worker, and the last chunks, which decide when the pass ends, are the
    small ones (with two workers on the planner's check pass one ended 0.19 s before the other in
    first-appearance order, 0.01 s in this)."""
    order: dict[Any, int] = {}
    sizes: dict[Any, int] = {}
    keys = []
    for position, (_, point) in enumerate(todo):
        here = group(point)
        keys.append(position if here is None else order.setdefault(here, position))
        if here is not None:
            sizes[order[here]] = sizes.get(order[here], 0) + 1
    return [item for _, item in sorted(zip(keys, todo), key=lambda pair: (-sizes.get(pair[0], 1), pair[0]))]


def keep_unless_failed(record: dict) -> bool:
    """Reuse rule for ``RunControl.reuse``: a stored record is kept unless its point failed with an error."""
    return record.get("status") != "error"


@dataclass(frozen=True)
class RunControl:
    """What a run reuses, how far it goes and what it shows (where it runs is the :class:`Session`)."""

    out: str | os.PathLike | None = None  # results file: records are appended, and reused by a later run
    reuse: Callable[[dict], bool] | None = None  # whether a stored record stands (None: every one does)
    limit: int | None = None  # most new points computed; the rest are left for a later run
    should_stop: Callable[[int], bool] | None = None  # asked with the count computed after each finished chunk
    progress: bool | None = None  # show a progress bar (None: when the output is a terminal)
    label: str = "sweep"
    bar: Progress | None = None  # a bar shared with other runs (not finished here)


def run_points(evaluator: Evaluator, points: Sequence[Point], session: Session | None = None,
               control: RunControl = RunControl()) -> RunReport:
    """Evaluate ``points`` (reusing records already in ``control.out``) and return every record in point order.

    Without a ``session`` the run gets its own, on all local cores. A stop (``limit``,
    ``should_stop``, Ctrl-C, an exception) leaves the rest of the points for a later run
    with the same results file; what was computed is written first.
    """
    if session is None:
        with Session() as own:
            return run_points(evaluator, points, own, control)
    started = time.monotonic()
    store = ResultsFile(control.out) if control.out is not None else None
    report = RunReport(records=[None] * len(points), backend=session.backend)
    if store is None:
        # nothing to reuse: each key is made when its record is, while the workers compute
        keys: Sequence[str] = _Keys(evaluator.identity, points)
        todo = list(enumerate(points))
    else:
        key = KeyMaker(evaluator.identity)
        keys = [key(point) for point in points]
        todo = _reuse_stored(report, keys, points, store.load(), control.reuse)
    if control.limit is not None and len(todo) > max(0, control.limit):
        todo = todo[:max(0, control.limit)]
        report.stopped = True  # points are left for a later run
    if todo:
        _compute(evaluator, points, keys, todo, session, control, store, report)
    report.elapsed_s = time.monotonic() - started
    return report


class _Keys:
    """``stable_key`` of each point, made when first asked for."""

    def __init__(self, identity: Any, points: Sequence[Point]):
        self.key, self.points = KeyMaker(identity), points

    def __getitem__(self, index: int) -> str:
        return self.key(self.points[index])


def _reuse_stored(report: RunReport, keys: list[str], points: Sequence[Point], stored: dict[str, dict],
                  reuse: Callable[[dict], bool] | None) -> list[tuple[int, Point]]:
    """Fill ``report`` with the stored records that stand; the (index, point) pairs still to compute."""
    todo = []
    for index, (key, point) in enumerate(zip(keys, points)):
        old = stored.get(key)
        if old is not None and (reuse is None or reuse(old)):
            report.records[index] = old
            report.reused += 1
        else:
            todo.append((index, point))
    return todo


class _InOrder:
    """Appends finished records to the results file in point order, whatever order they finish in."""

    def __init__(self, order: list[int], store: ResultsFile | None):
        self.order = order
        self.store = store
        self.finished: dict[int, dict] = {}
        self.next = 0  # position in ``order`` of the next record to write

    def add(self, index: int, record: dict) -> None:
        self.finished[index] = record
        while self.next < len(self.order) and self.order[self.next] in self.finished:
            self._write(self.finished.pop(self.order[self.next]))
            self.next += 1

    def flush(self) -> None:
        """Write everything finished, gaps or not (the run stopped), and close the file."""
        for index in sorted(self.finished):
            self._write(self.finished[index])
        self.finished.clear()
        if self.store is not None:
            self.store.close()

    def _write(self, record: dict) -> None:
        if self.store is not None:
            self.store.append(record)


def _compute(evaluator: Evaluator, points: Sequence[Point], keys: list[str], todo: list[tuple[int, Point]],
             session: Session, control: RunControl, store: ResultsFile | None, report: RunReport) -> None:
    """Run the ``todo`` points on the session's pool, a few chunks per worker in flight, into ``report``."""
    pool = session.open(len(todo))
    report.workers = pool.workers
    bar = control.bar if control.bar is not None else Progress(len(todo), control.label, control.progress)
    group = getattr(evaluator, "chunk_group", None)
    if group is not None and pool.workers > 1:
        groups = {id(point): group(point) for _, point in todo}  # once per point: both steps below ask
        group = lambda point: groups[id(point)]  # noqa: E731
        todo = _grouped(todo, group)
    writer = _InOrder([index for index, _ in todo], store)
    source = _chunks(todo, pool.workers, group)
    pending: list[Any] = []
    clean = False
    halted = False  # should_stop said so: nothing more is submitted
    try:
        for chunk in source:
            pending.append(pool.submit(evaluator, chunk))
            if len(pending) >= pool.in_flight:
                break
        while pending:
            for token, results in pool.wait(pending):
                pending.remove(token)
                for index, body in results:
                    record = {"key": keys[index], "status": body["status"], "point": dict(points[index]),
                              "error": body.get("error"), "metrics": body.get("metrics", {})}
                    report.records[index] = record
                    writer.add(index, record)
                    report.computed += 1
                    bar.advance(record["status"])
                if control.should_stop is not None and not halted and control.should_stop(report.computed):
                    halted = True
                if not halted:
                    chunk = next(source, None)
                    if chunk is not None:
                        pending.append(pool.submit(evaluator, chunk))
        clean = True
    finally:
        writer.flush()
        session.clean = session.clean and clean
        if control.bar is None:
            bar.finish()
    report.stopped = report.stopped or halted or report.computed < len(todo)
