"""Read a PyTorch profiler (Kineto) trace file into a ``Trace``.

A trace is Chrome trace-event JSON, often gzipped: ``traceEvents`` holds complete events
(``ph: X``) for CPU ops (``cat: cpu_op``), ``record_function`` annotations
(``user_annotation``), CUDA runtime calls (``cuda_runtime``) and GPU activity (``kernel``,
``gpu_memcpy``, ``gpu_memset``), plus flow events (``ac2g``) that join a launch to its
kernel. The reader takes one pass over the events to sort them by kind, links each GPU
event to its launch by ``correlation`` and to its callers by time (``link.py``), and then
prices it: category (``kinds.py``), GEMM shape (``shapes.py``), collective (``comms.py``).

Kineto writes microseconds from an arbitrary epoch; a ``Trace`` holds seconds from the
trace's first event.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import zlib
from collections import defaultdict
from pathlib import Path

from mpsim.errors import InputError
from mpsim.traces.comms import collective_of
from mpsim.traces.kinds import categorize, rule_for
from mpsim.traces.link import enclosing_ops
from mpsim.traces.model import CpuOp, Kernel, Step, Trace
from mpsim.traces.shapes import gemm_of

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
OP_CATEGORIES = ("cpu_op", "user_annotation")
# the runtime (and, in newer traces, driver) calls that launch GPU work
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
FLOW_CATEGORIES = ("ac2g", "async_cpu_to_gpu")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
US = 1e-6  # seconds per Kineto microsecond


def _read_json(path: str) -> object:
    """The parsed JSON of a ``.json`` or gzipped file (gzip told by its magic bytes)."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except IsADirectoryError:
        raise InputError("is a folder; name a trace file, or pass the folder to load_traces", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise InputError(f"truncated or corrupt gzip ({exc})", path) from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InputError("not a JSON trace (not UTF-8 text)", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", path) from None


def _number(event: dict, key: str, path: str, index: int) -> float:
    value = event.get(key)
    # bool is not a time either; Python's json reads NaN and Infinity, which are not times
    if (type(value) is not int and type(value) is not float) or not math.isfinite(value) or \
            (key == "dur" and value < 0):
        raise InputError(f"event {index} ({str(event.get('name', '?'))[:60]!r}) has no valid {key!r}: "
                         f"{str(value)[:30]}", path)
    return float(value)


def _check_fields(event: dict, path: str, index: int) -> None:
    """The fields the reader uses of a GPU event, op or runtime call have the JSON types Kineto writes."""
    problem = None
    if not isinstance(event.get("name", ""), str):
        problem = "a 'name' that is not a string"
    elif not isinstance(event.get("args", {}), dict):
        problem = "'args' that are not an object"
    elif isinstance(event.get("pid"), (list, dict)) or isinstance(event.get("tid"), (list, dict)):
        problem = "a 'pid' or 'tid' that is not a number or a string"
    if problem:
        raise InputError(f"event {index} has {problem}", path)


def _frozen(value):
    """Lists as tuples, all the way down: a ``CpuOp`` stays hashable, so kernels can be grouped by it."""
    return tuple(_frozen(item) for item in value) if isinstance(value, list) else value


def _shapes(args: dict) -> tuple[tuple | None, tuple | None]:
    dims, types = args.get("Input Dims"), args.get("Input type")
    return (_frozen(dims) if isinstance(dims, list) else None), (_frozen(types) if isinstance(types, list) else None)


class _Events:
    """The trace's events sorted by what the reader does with them (one pass)."""

    def __init__(self, events: list, path: str):
        self.gpu: list[dict] = []
        self.ops: dict[tuple, list[dict]] = defaultdict(list)  # (pid, tid) -> ops and annotations
        self.launches: dict[int, tuple] = {}  # correlation -> (pid, tid, ts_us) of the runtime call
        self.flows: dict[int, tuple] = {}  # flow id -> (pid, tid, ts_us) of its start on the CPU
        self.origin_us = float("inf")
        for index, event in enumerate(events):
            if not isinstance(event, dict):
                raise InputError(f"event {index} is not an object", path)
            phase, cat = event.get("ph"), event.get("cat")
            if phase == "X":
                used = cat in GPU_CATEGORIES or cat in OP_CATEGORIES or cat in LAUNCH_CATEGORIES
                if not used:  # other spans (the profiler's own, Python frames) only move the origin
                    ts = event.get("ts")
                    if (type(ts) is int or type(ts) is float) and math.isfinite(ts):
                        self.origin_us = min(self.origin_us, ts)
                    continue
                _check_fields(event, path, index)
                ts = _number(event, "ts", path, index)
                self.origin_us = min(self.origin_us, ts)
                if cat in GPU_CATEGORIES:
                    _number(event, "dur", path, index)
                    self.gpu.append(event)
                elif cat in OP_CATEGORIES:
                    _number(event, "dur", path, index)
                    self.ops[(event.get("pid"), event.get("tid"))].append(event)
                elif cat in LAUNCH_CATEGORIES:
                    correlation = (event.get("args") or {}).get("correlation")
                    if isinstance(correlation, int):
                        self.launches[correlation] = (event.get("pid"), event.get("tid"), ts)
            elif phase == "s" and cat in FLOW_CATEGORIES and isinstance(event.get("id"), int):
                self.flows[event["id"]] = (event.get("pid"), event.get("tid"), _number(event, "ts", path, index))


def _device(top: dict, gpu: list[dict]) -> dict:
    """The ``deviceProperties`` entry of the kernels' device (the first entry if none matches)."""
    listed = top.get("deviceProperties")
    props = [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []
    devices = [_int_or_none((event.get("args") or {}).get("device")) for event in gpu]
    device = max(set(devices) - {None}, key=devices.count, default=None)
    for entry in props:
        if entry.get("id") == device:
            return entry
    return props[0] if props else {}


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _steps(events: _Events, origin_us: float) -> tuple[Step, ...]:
    steps = []
    for ops in events.ops.values():
        for op in ops:
            match = _STEP.match(op.get("name", ""))
            if match:
                start = op["ts"] - origin_us
                steps.append(Step(int(match.group(1)), start * US, (start + op["dur"]) * US))
    return tuple(sorted(steps, key=lambda step: (step.start_s, step.number)))


def load_trace(path: str, cpu_only: bool = False) -> Trace:
    """One rank's trace from a Kineto ``.json`` or ``.json.gz`` file.

    A trace without GPU kernels is refused unless ``cpu_only``: a pipeline run on CPU ranks
    (the validation job over gloo) records only its ``ProfilerStep#N`` ranges and pass
    annotations, which is what comparing passes needs (``compare.py``); it must have
    annotations then.
    """
    top = _read_json(path)
    if isinstance(top, list):  # Chrome's other trace layout: the bare list of events
        top = {"traceEvents": top}
    if not isinstance(top, dict) or not isinstance(top.get("traceEvents"), list):
        raise InputError("not a PyTorch profiler trace: no 'traceEvents' list", path)
    events = _Events(top["traceEvents"], path)
    if not events.gpu and not cpu_only:
        raise InputError("no GPU kernels in the trace (was it recorded with ProfilerActivity.CUDA?)", path)
    if not events.gpu and not any(op.get("cat") == "user_annotation" for ops in events.ops.values() for op in ops):
        raise InputError("neither GPU kernels nor record_function annotations in the trace", path)
    origin = events.origin_us

    # where each GPU event was launched: its runtime call, else the start of its flow
    launch_of: dict[int, tuple] = {}
    for index, event in enumerate(events.gpu):
        correlation = (event.get("args") or {}).get("correlation")
        if isinstance(correlation, int):
            found = events.launches.get(correlation) or events.flows.get(correlation)
            if found is not None:
                launch_of[index] = found
    by_thread: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for index, (pid, tid, ts) in launch_of.items():
        by_thread[(pid, tid)].append((index, ts))
    callers: dict[int, list[dict]] = {}
    for thread, launches in by_thread.items():
        ops = events.ops.get(thread, [])
        intervals = [(op["ts"], op["ts"] + op["dur"], i) for i, op in enumerate(ops)]
        for index, chain in enclosing_ops(intervals, launches).items():
            callers[index] = [ops[i] for i in chain]

    cpu_ops: dict[int, CpuOp] = {}  # id(event) -> its CpuOp, so a shared caller is one object

    def cpu_op(event: dict) -> CpuOp:
        key = id(event)
        if key not in cpu_ops:
            dims, types = _shapes(event.get("args") or {})
            cpu_ops[key] = CpuOp(name=event.get("name", ""), start_s=(event["ts"] - origin) * US,
                                 duration_s=event["dur"] * US, thread=_int_or_none(event.get("tid")) or 0,
                                 input_dims=dims, input_types=types)
        return cpu_ops[key]

    steps = _steps(events, origin)
    step_starts = [step.start_s for step in steps]
    kernels = []
    for index, event in enumerate(events.gpu):
        args = event.get("args") or {}
        chain = callers.get(index, [])
        ops = tuple(cpu_op(caller) for caller in chain if caller.get("cat") == "cpu_op")
        innermost = ops[-1] if ops else None
        name, cat = event.get("name", ""), event["cat"]
        category = categorize(cat, name, innermost.name if innermost else None)
        gemm = collective = None
        if category == "gemm":
            rule = rule_for(cat, name, innermost.name if innermost else None)
            if rule is not None and rule.field == "name":  # the product itself, not its split-K helper
                gemm = gemm_of(name, ops)
        elif category == "collective":
            collective = collective_of(name, args, [(c.get("name", ""), c.get("args") or {}) for c in chain])
        step = launch_s = launch_thread = None
        if index in launch_of:
            launch_s = (launch_of[index][2] - origin) * US
            launch_thread = _int_or_none(launch_of[index][1])
            position = bisect.bisect_right(step_starts, launch_s) - 1
            if position >= 0 and launch_s <= steps[position].end_s:
                step = steps[position].number
        stream = _int_or_none(args.get("stream"))
        kernels.append(Kernel(
            name=name, category=category, start_s=(event["ts"] - origin) * US, duration_s=event["dur"] * US,
            stream=stream if stream is not None else (_int_or_none(event.get("tid")) or 0),
            correlation=_int_or_none(args.get("correlation")), op=innermost,
            op_names=tuple(caller.get("name", "") for caller in chain), step=step, gemm=gemm,
            collective=collective, launch_s=launch_s, launch_thread=launch_thread))
    kernels.sort(key=lambda k: (k.start_s, k.stream, k.name))

    device = _device(top, events.gpu) if events.gpu else {}  # a CPU-only trace names no GPU it ran on
    info = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
    major, minor = _int_or_none(device.get("computeMajor")), _int_or_none(device.get("computeMinor"))
    annotations = sorted((cpu_op(op) for ops in events.ops.values() for op in ops
                          if op.get("cat") == "user_annotation"), key=lambda a: (a.start_s, a.thread, a.name))
    return Trace(source=path, device_name=device.get("name") if isinstance(device.get("name"), str) else None,
                 device_sms=_int_or_none(device.get("numSms")),
                 device_memory_bytes=_int_or_none(device.get("totalGlobalMem")),
                 compute_capability=(major, minor) if major is not None and minor is not None else None,
                 rank=_int_or_none(info.get("rank")), world_size=_int_or_none(info.get("world_size")),
                 kernels=tuple(kernels), steps=steps, annotations=tuple(annotations),
                 origin_us=_clock_origin_us(top, origin))


def _clock_origin_us(top: dict, origin_us: float) -> float | None:
    """The trace's time zero on the recording host's clock (recent Kineto writes ``ts`` relative
    to ``baseTimeNanoseconds``; older files write the clock itself)."""
    if not math.isfinite(origin_us):
        return None
    base = top.get("baseTimeNanoseconds")
    if base is None:
        return origin_us
    if (type(base) is int or type(base) is float) and math.isfinite(base):
        return base / 1000.0 + origin_us
    return None


def trace_files(paths: list[str]) -> list[str]:
    """The trace files named by ``paths``: files as given, folders expanded to their
    ``*.json`` and ``*.json.gz`` files in name order."""
    files: list[str] = []
    for path in paths:
        folder = Path(path)
        if folder.is_dir():
            found = sorted(str(p) for p in folder.iterdir()
                           if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz")))
            if not found:
                raise InputError("folder holds no .json or .json.gz trace files", path)
            files.extend(found)
        else:
            files.append(path)
    return files


def load_traces(paths: list[str], cpu_only: bool = False, field: str | None = None) -> list[Trace]:
    """Every rank's trace from files or folders (one file per rank), sorted by rank (traces
    without ``distributedInfo`` last, by file name); ``cpu_only`` as in :func:`load_trace`,
    ``field`` names the option the paths came from in the error for none."""
    if not paths:
        raise InputError("no trace file given", field=field)
    traces = [load_trace(path, cpu_only) for path in trace_files(paths)]
    return sorted(traces, key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.source))
