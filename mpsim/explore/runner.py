"""Running many points: in this process, on all local cores, or on a Ray cluster.

One loop drives every backend. Points go out in chunks (a few per worker at a time,
so the queue stays short and an interrupt loses little); each finished chunk is counted
for the progress bar, and its records are appended to the results file in point order.
The order is fixed by the points, not by which worker finished first, so the same sweep
writes the same file. When the run stops early (a limit, a callback, Ctrl-C, an
exception), every record already computed is still written before returning.

Backends differ only in how a chunk reaches a worker:

* ``serial``: evaluated here, one point at a time (``workers=1``);
* ``local``: a ``concurrent.futures`` process pool on all cores by default;
* ``ray``: ``ray.put`` of the evaluator and one remote task per chunk, on the cluster at
  ``address`` (or a local Ray instance). Ray is an optional extra: ``pip install 'mpsim[ray]'``.

Every backend runs the same function, ``evaluate_chunk(evaluator, chunk)``, so their
results are the same record for record.
"""

from __future__ import annotations

import concurrent.futures as futures
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from mpsim.errors import InputError
from mpsim.explore.axes import Point
from mpsim.explore.evaluate import error_text, failure
from mpsim.explore.progress import Progress
from mpsim.explore.store import ResultsFile, stable_key

BACKENDS = ("local", "ray")
RAY_INSTALL_HINT = "--backend ray needs Ray: pip install 'mpsim[ray]' (or pip install ray)"
CHUNKS_IN_FLIGHT_PER_WORKER = 2
MAX_CHUNK = 32
MAX_GROUP_CHUNK = 256  # a chunk kept whole for its group's shared work ends here anyway
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): a signal the kernel sends when the parent dies
PARENT_POLL_S = 1.0


class Evaluator(Protocol):
    """What the runner needs from an evaluator (see ``evaluate.py``)."""

    identity: Any

    def evaluate(self, point: Point) -> dict[str, Any]: ...


Chunk = list[tuple[int, Point]]


def evaluate_chunk(evaluator: Evaluator, chunk: Chunk) -> list[tuple[int, dict[str, Any]]]:
    """Evaluate each point of a chunk; the same function runs in every backend."""
    out = []
    for index, point in chunk:
        try:
            body = evaluator.evaluate(point)
        except Exception as exc:  # noqa: BLE001 - one broken point must not lose the chunk
            body = failure("error", error_text(exc))
        out.append((index, body))
    return out


class _SerialPool:
    """Evaluates each chunk here, when the loop asks for it."""

    workers = 1
    in_flight = 1  # nothing runs ahead: a stop takes effect after the current chunk

    def submit(self, evaluator: Evaluator, chunk: Chunk) -> Any:
        return (evaluator, chunk)

    def wait(self, pending: Sequence[Any]) -> list[tuple[Any, list]]:
        first = pending[0]
        return [(first, evaluate_chunk(*first))]

    def close(self, cancel: bool) -> None:
        pass


def _worker_start(parent: int) -> None:
    """Set up a pool worker: Ctrl-C is the main process's to handle (it saves what is done
    and stops the workers), and the worker dies with its parent, however the parent ends
    (SIGKILL included), instead of waiting forever for work that will not come."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the kernel kills us when the parent dies
        except (OSError, AttributeError):
            _watch_parent(parent)
    else:
        _watch_parent(parent)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _watch_parent(parent: int) -> None:
    """Where the kernel cannot be asked: a thread that ends the worker once the parent is gone."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="mpsim-parent-watch").start()


class _LocalPool:
    """A process pool; the evaluator travels with each chunk (a few kB, pickled once per chunk)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.in_flight = workers * CHUNKS_IN_FLIGHT_PER_WORKER
        self.executor = futures.ProcessPoolExecutor(max_workers=workers, initializer=_worker_start,
                                                    initargs=(os.getpid(),))

    def submit(self, evaluator: Evaluator, chunk: Chunk) -> Any:
        return self.executor.submit(evaluate_chunk, evaluator, chunk)

    def wait(self, pending: Sequence[Any]) -> list[tuple[Any, list]]:
        done, _ = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
        # report in submission order, so ties resolve the same way every run
        return [(f, f.result()) for f in pending if f in done]

    def close(self, cancel: bool) -> None:
        if not cancel:
            self.executor.shutdown(wait=True)
            return
        # interrupted: the points in flight are lost either way, so stop their workers now
        # rather than wait for them (seconds per chunk); finished points are already saved
        processes = list(getattr(self.executor, "_processes", {}).values())
        for process in processes:
            process.kill()
        self.executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(timeout=1.0)


class _RayPool:
    """Remote tasks on a Ray cluster; the evaluator is put in the object store once per run."""

    def __init__(self, workers: int | None, address: str | None):
        try:
            import ray
        except ImportError:
            raise InputError(RAY_INSTALL_HINT) from None
        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address is None and workers:
                options["num_cpus"] = workers
            ray.init(address=address, **options)
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.in_flight = self.workers * CHUNKS_IN_FLIGHT_PER_WORKER
        self.task = ray.remote(evaluate_chunk)
        self.refs: dict[int, tuple[Evaluator, Any]] = {}

    def submit(self, evaluator: Evaluator, chunk: Chunk) -> Any:
        held = self.refs.get(id(evaluator))
        if held is None or held[0] is not evaluator:
            held = self.refs[id(evaluator)] = (evaluator, self.ray.put(evaluator))
        return self.task.remote(held[1], chunk)

    def wait(self, pending: Sequence[Any]) -> list[tuple[Any, list]]:
        ready, _ = self.ray.wait(list(pending), num_returns=1)
        ready_set = set(ready)
        return [(ref, self.ray.get(ref)) for ref in pending if ref in ready_set]

    def close(self, cancel: bool) -> None:
        self.refs.clear()
        if self.started_here:  # a cluster we only connected to keeps running
            self.ray.shutdown()


class Session:
    """Workers for one or more runs: ``with Session("local") as session: run_points(..., session=session)``.

    A session keeps its process pool (or its Ray connection) across runs, which the
    planner uses for its two passes.
    """

    def __init__(self, backend: str = "local", workers: int | None = None, ray_address: str | None = None):
        if backend not in BACKENDS:
            raise InputError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}", "--backend")
        if workers is not None and workers < 1:
            raise InputError("must be 1 or more", "--workers")
        self.backend = backend
        self.wanted = workers
        self.ray_address = ray_address
        self.pool: Any = None
        self.clean = True

    def open(self, points: int) -> Any:
        """The pool, started on first use (serial when one worker or one point is all there is)."""
        if self.pool is None:
            if self.backend == "ray":
                self.pool = _RayPool(self.wanted, self.ray_address)
            else:
                workers = self.wanted or local_cores()
                self.pool = _SerialPool() if workers <= 1 or points <= 1 else _LocalPool(workers)
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(cancel=not self.clean)
            self.pool = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, kind: Any, value: Any, trace: Any) -> None:
        self.clean = kind is None
        self.close()


def ray_available() -> bool:
    """True when ``import ray`` works."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def local_cores() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
    work a worker caches (the planner: layouts with one set of schedules) go to one worker; a
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
    keys = [stable_key(evaluator.identity, point) for point in points]
    store = ResultsFile(control.out) if control.out is not None else None
    report = RunReport(records=[None] * len(points), backend=session.backend)
    todo = _reuse_stored(report, keys, points, store.load() if store is not None else {}, control.reuse)
    if control.limit is not None and len(todo) > max(0, control.limit):
        todo = todo[:max(0, control.limit)]
        report.stopped = True  # points are left for a later run
    if todo:
        _compute(evaluator, points, keys, todo, session, control, store, report)
    report.elapsed_s = time.monotonic() - started
    return report


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
    writer = _InOrder([index for index, _ in todo], store)
    source = _chunks(todo, pool.workers, getattr(evaluator, "chunk_group", None))
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
