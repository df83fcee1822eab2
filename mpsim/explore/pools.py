"""Workers for many points: this process, a pool of local processes, or a Ray cluster.

A backend gets chunks of points and gives back their records; ``runner.py`` drives it.
Every backend runs the same function, ``evaluate_chunk(evaluator, chunk)``, so their
results are the same record for record:

* ``serial``: evaluated here, one point at a time (``workers=1``);
* ``local``: a ``concurrent.futures`` process pool on all cores by default, whose
  workers leave Ctrl-C to the main process and die with it;
* ``ray``: ``ray.put`` of the evaluator and one remote task per chunk, on the cluster at
  ``address`` (or a local Ray instance). Ray is an optional extra: ``pip install 'mpsim[ray]'``.

A :class:`Session` keeps its pool across runs (the planner's two passes share one).
"""

from __future__ import annotations

import concurrent.futures as futures
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator, Protocol, Sequence

from mpsim.engine.core import cyclic_gc_paused
from mpsim.errors import InputError
from mpsim.explore.axes import Point
from mpsim.explore.evaluate import error_text, failure

BACKENDS = ("local", "ray")
RAY_INSTALL_HINT = "--backend ray needs Ray: pip install 'mpsim[ray]' (or pip install ray)"
CHUNKS_IN_FLIGHT_PER_WORKER = 2
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): a signal the kernel sends when the parent dies
PARENT_POLL_S = 1.0
# a wait for a local pool's results is cut in slices this long; a stop (SIGINT, SIGTERM) that
# arrives during one is taken at its end (``_stops_deferred``)
STOP_CHECK_S = 0.05
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Python's cycle collector looks at the young objects every 700 net allocations by default, and
# walks everything a process holds each time the objects that survived two such looks have
# grown the old generation by a quarter. Evaluating points makes millions of objects that live
# a while (a plan's layout groups, workloads, priced passes, schedules' short forms) and few
# reference cycles: at the default pace they get promoted, and a plan spent a quarter of its
# time in full collections. While points are evaluated the young look waits for this many
# allocations instead: most of those objects are gone by then, and cycles are still collected.
YOUNG_COLLECTION_ALLOCATIONS = 50_000
_IN_WORKER = False  # set in a local pool's worker processes (``_worker_start``), never in the caller's


class Evaluator(Protocol):
    """What the runner needs from an evaluator (see ``evaluate.py``)."""

    identity: Any

    def evaluate(self, point: Point) -> dict[str, Any]: ...


Chunk = list[tuple[int, Point]]


@contextmanager
def fewer_collections() -> Iterator[None]:
    """The cycle collector's young threshold raised to ``YOUNG_COLLECTION_ALLOCATIONS`` (never
    lowered), and set back afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], YOUNG_COLLECTION_ALLOCATIONS), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def evaluate_chunk(evaluator: Evaluator, chunk: Chunk) -> list[tuple[int, dict[str, Any]]]:
    """Evaluate each point of a chunk; the same function runs in every backend."""
    out = []
    # an evaluator whose points leave few reference cycles (the planner's checks) may have the
    # cycle collector wait for the chunk's end; one that simulates keeps the usual pace, since
    # a chunk's SimPy runs would otherwise all stay in memory until then. In a pool worker, what
    # a check chunk leaves alive is the worker's caches (layout groups, schedules' short forms,
    # priced passes), which later collections would walk again and again: it is frozen out of
    # them (gc.freeze) instead of walked once more (2-4 % of a plan; the few cycles a chunk
    # leaves are not freed until the worker ends; its peak memory did not grow)
    checks = getattr(evaluator, "collect_after_chunk", False)
    paused = cyclic_gc_paused() if checks else nullcontext()
    with fewer_collections(), paused:
        for index, point in chunk:
            try:
                body = evaluator.evaluate(point)
            except Exception as exc:  # noqa: BLE001 - one broken point must not lose the chunk
                body = failure("error", error_text(exc))
            out.append((index, body))
        if checks and _IN_WORKER:
            gc.freeze()
    return out


class _SerialPool:
    """Evaluates each chunk here, when the loop asks for it; its chunks are single points, so
    the collector keeps the evaluation pace (``fewer_collections``) until the pool closes."""

    workers = 1
    in_flight = 1  # nothing runs ahead: a stop takes effect after the current chunk

    def __init__(self) -> None:
        self._pace = fewer_collections()
        self._pace.__enter__()

    def submit(self, evaluator: Evaluator, chunk: Chunk) -> Any:
        return (evaluator, chunk)

    def wait(self, pending: Sequence[Any]) -> list[tuple[Any, list]]:
        first = pending[0]
        return [(first, evaluate_chunk(*first))]

    def close(self, cancel: bool) -> None:
        self._pace.__exit__(None, None, None)


@contextmanager
def _stops_deferred() -> Iterator[list[int]]:
    """SIGINT and SIGTERM, while ``concurrent.futures`` runs, noted instead of acted on, and
    acted on when it has returned.

    Both stop a sweep by raising KeyboardInterrupt wherever the main thread stands (Python's
    SIGINT handler, and ``cli.main``'s for SIGTERM). Inside the library that can be halfway
    through ``futures.wait``, which takes the futures' locks one by one in a loop that an
    exception leaves with some still held. The executor's own thread then waits for one of
    them forever (it cancels or completes that future), and so does the interpreter at exit,
    which joins that thread: the sweep said "interrupted" and never ended. Here a signal is
    only written down (the yielded list); on leaving, the handler that was in place is called
    with it, from this code, where no lock of the library is held. A handler that is not a
    Python function (the signal ignored, or the default that ends the process) is left in
    place, and so is everything off the main thread, where handlers cannot be set."""
    noted: list[int] = []
    replaced: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            handler = signal.getsignal(number)
            if callable(handler):
                replaced[number] = handler
                signal.signal(number, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        for number, handler in replaced.items():
            signal.signal(number, handler)
        if noted:
            replaced[noted[0]](noted[0], None)


def _worker_start(parent: int, start_method: str) -> None:
    """Set up a pool worker: Ctrl-C is the main process's to handle (it saves what is done
    and stops the workers), SIGTERM ends the worker, and the worker dies with its parent,
    however the parent ends (SIGKILL included), instead of waiting forever for work that will
    not come.

    ``parent`` is the pool's process. A forked worker asks the kernel to kill it when its
    parent dies. A worker from a fork server is the server's child, and the server lives as
    long as any of its children does (each holds the pipe whose end it waits for), so such a
    worker watches ``parent`` itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a forked worker inherits whatever handler the caller had: the caller's KeyboardInterrupt,
    # or the note ``_stops_deferred`` takes while the pool starts; a worker told to end, ends
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    global _IN_WORKER
    _IN_WORKER = True
    if start_method != "fork" or not sys.platform.startswith("linux"):
        if not _alive(parent):  # the pool's process ended before this worker began
            os._exit(1)
        _watch(parent)
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the kernel kills us when the parent dies
    except (OSError, AttributeError):
        _watch(parent)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's: not ours, so ours has ended
        return False
    try:  # a killed process stays a zombie until its own parent reaps it: ended all the same
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc here
        return True


def _watch(parent: int) -> None:
    """Where the kernel cannot be asked: a thread that ends the worker once ``parent`` is gone."""
    def watch() -> None:
        while _alive(parent):
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="mpsim-parent-watch").start()


# Runtimes that keep threads of their own running after their own shutdown (Ray leaves a dozen,
# gRPC's among them, after ray.shutdown()), which take locks at any moment
FORK_UNSAFE_MODULES = ("ray", "grpc")


def process_context(threaded: str = "forkserver") -> multiprocessing.context.BaseContext:
    """How worker processes start: ``fork`` (the workers begin at once, with everything
    imported) unless this process has loaded a runtime of ``FORK_UNSAFE_MODULES``, then
    ``threaded``. A fork copies only the thread that called it, with every lock the other
    threads held at that moment held for good, so a worker forked beside such threads can stop
    forever on its first use of one. ``forkserver`` forks from a clean single-threaded server
    (the mpsim modules it preloads are imported once); ``spawn`` starts a fresh interpreter per
    worker. Idle thread pools (OpenBLAS, OpenMP, torch) reset themselves across a fork and do
    not count. Platforms without ``fork`` keep their default (spawn)."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" not in methods:
        return multiprocessing.get_context()
    if not any(name in sys.modules for name in FORK_UNSAFE_MODULES):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context(threaded if threaded in methods else "spawn")


class _LocalPool:
    """A process pool; the evaluator travels with each chunk (a few kB, pickled once per chunk)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.in_flight = workers * CHUNKS_IN_FLIGHT_PER_WORKER
        context = process_context()
        if context.get_start_method() == "forkserver":
            # the server imports the evaluation once; each worker forks from it with that done
            context.set_forkserver_preload(["mpsim.explore.evaluate", "mpsim.explore.planner"])
        self.executor = futures.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_start,
                                                    initargs=(os.getpid(), context.get_start_method()))

    def submit(self, evaluator: Evaluator, chunk: Chunk) -> Any:
        with _stops_deferred():
            return self.executor.submit(evaluate_chunk, evaluator, chunk)

    def wait(self, pending: Sequence[Any]) -> list[tuple[Any, list]]:
        with _stops_deferred() as stops:
            done: set = set()
            while not done and not stops:
                done, _ = futures.wait(pending, timeout=STOP_CHECK_S, return_when=futures.FIRST_COMPLETED)
            # report in submission order, so ties resolve the same way every run
            return [(f, f.result()) for f in pending if f in done]

    def close(self, cancel: bool) -> None:
        with _stops_deferred():  # a second Ctrl-C waits until the pool is down
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
        # ray.init installs its own SIGTERM handler (sys.exit) and ray.shutdown leaves it: an
        # instance started here gives the process its handlers back when it shuts down
        self.handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
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
            for number, handler in self.handlers.items():
                if handler is not None and signal.getsignal(number) is not handler:
                    try:
                        signal.signal(number, handler)
                    except ValueError:  # only the main thread may set handlers; elsewhere Ray's stays
                        pass


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
