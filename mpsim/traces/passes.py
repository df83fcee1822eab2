"""The microbatch passes a profiler trace records, and how long each one took.

A pipeline framework marks each pass with a ``record_function`` annotation. PyTorch's
``torch.distributed.pipelining`` (``schedules.py``) writes two forms:

- ``ScheduleGPipe`` (and the forward-only schedule): ``Forward {i}`` and ``Backward {i}``
  around microbatch ``i``'s receive, compute and send; the stage is not named (these
  schedules hold one stage per rank);
- every schedule run by its action runtime (``ScheduleInterleaved1F1B``,
  ``ScheduleLoopedBFS``, ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
  ``ScheduleDualPipeV``, a schedule loaded from CSV): ``PP:`` and the action as torch
  prints it, ``PP:1F0``, ``PP:0B3``, ``PP:2I1``, ``PP:2W1``, ``PP:(0F3;7B1)OVERLAP_F_B``,
  which is mpsim's own text form of an action; its sends and receives are actions of
  their own (``PP:1RECV_F0``, ``PP:0SEND_B2``).

``Schedule1F1B`` writes none, and Megatron-Core marks its pipeline phases with NVTX
ranges, which Kineto does not record: such traces have steps and kernels but no passes.

A pass's measured time is its time on the GPU when the trace has kernels: from the start
of the first kernel launched inside it to the end of the last (by name in the kernel's
callers, or launched by an op that started inside the pass on another thread, as the
autograd engine's threads launch a backward), point-to-point kernels left out, because
they last as long as the wait for the peer. That elapsed time, not the kernels' busy
union (also kept), is what a simulated action's duration stands for: where the host
launches kernels slower than the GPU runs them, the GPU waits between them, inside the
pass. On a CPU-only trace it is the annotation's own span, less the
time spent at its start waiting for its input: the end of the receive it consumes (a
``gloo:recv`` or ``nccl:recv`` range, opened in the pass itself or in the ``RECV``
action before it) tells when the input arrived.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from mpsim.schedules.actions import Action, Overlapped
from mpsim.traces.model import CpuOp, Kernel, Trace
from mpsim.traces.intervals import length, merged

_RUNTIME = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")
_OVERLAPPED = re.compile(r"^PP:\((\d+)F(\d+);(\d+)([BI])(\d+)\)OVERLAP_F_B$")
_SINGLE = re.compile(r"^(Forward|Backward) (\d+)$")
_RECV_ACTION = re.compile(r"^PP:(\d+)RECV_([FB])(\d+)$")
_RECEIVE = re.compile(r"^\w+:recv$")  # the backend's range of one receive: gloo:recv, nccl:recv


@dataclass(frozen=True)
class PassName:
    """What a pass annotation names: an action, or a pair; ``stage`` None when the name has none."""

    item: Action | Overlapped | None  # None for the stage-less GPipe form until its stage is known
    kind: str  # F or B for the stage-less form
    microbatch: int


def parse_pass(name: str) -> PassName | None:
    """The pass an annotation name marks, or None when it marks no compute pass."""
    match = _RUNTIME.match(name)
    if match:
        action = Action(int(match.group(1)), match.group(2), int(match.group(3)))
        return PassName(action, action.kind, action.microbatch)
    match = _OVERLAPPED.match(name)
    if match:
        forward = Action(int(match.group(1)), "F", int(match.group(2)))
        backward = Action(int(match.group(3)), match.group(4), int(match.group(5)))
        return PassName(Overlapped(forward, backward), "F&B", forward.microbatch)
    match = _SINGLE.match(name)
    if match:
        return PassName(None, "F" if match.group(1) == "Forward" else "B", int(match.group(2)))
    return None


@dataclass(frozen=True)
class MeasuredPass:
    """One pass in one profiler step of one trace."""

    name: str  # the annotation as written
    parsed: PassName
    step: int
    start_s: float  # trace time of the annotation's start
    end_s: float
    busy_s: float  # the GPU work (the union of its kernels), or the CPU span less the input wait
    wait_s: float  # CPU trace: time at the start spent waiting for the input (0 on a GPU trace)
    spans: tuple[tuple[float, float], ...]  # what to draw: kernel intervals, or the computing part of the span

    @property
    def elapsed_s(self) -> float:
        """The pass's measured time: first kernel start to last kernel end on a GPU trace (its
        gaps waiting for launches included); on a CPU trace the computing part of its span."""
        return self.spans[-1][1] - self.spans[0][0] if self.spans else 0.0


def stage_names(trace: Trace) -> set[int]:
    """Stages named by the trace's pass annotations."""
    stages: set[int] = set()
    for annotation in trace.annotations:
        parsed = parse_pass(annotation.name)
        if parsed is not None and parsed.item is not None:
            items = (parsed.item.forward, parsed.item.backward) if isinstance(parsed.item, Overlapped) \
                else (parsed.item,)
            stages.update(a.stage for a in items)
    return stages


def _in_step(trace: Trace, op: CpuOp) -> int | None:
    for step in trace.steps:
        if step.start_s <= op.start_s < step.end_s:
            return step.number
    return None


def _input_receives(annotations: list[CpuOp], passes: list[tuple[CpuOp, PassName]]) -> dict[int, list[CpuOp]]:
    """For each pass (by index into ``passes``), the receive ranges whose data it consumes."""
    receives = [a for a in annotations if _RECEIVE.match(a.name)]
    posted_in = {}  # id of a RECV action annotation -> the receives opened inside it
    for action in (a for a in annotations if _RECV_ACTION.match(a.name)):
        posted_in[id(action)] = [r for r in receives
                                 if action.start_s <= r.start_s <= action.start_s + action.duration_s]
    latest_recv: dict[tuple[int, str, int], CpuOp] = {}
    found: dict[int, list[CpuOp]] = {}
    ordered = sorted([(a.start_s, 0, a, None) for a in annotations if _RECV_ACTION.match(a.name)]
                     + [(op.start_s, 1, op, index) for index, (op, _) in enumerate(passes)], key=lambda t: t[:2])
    for _, is_pass, op, index in ordered:
        if not is_pass:
            match = _RECV_ACTION.match(op.name)
            latest_recv[(int(match.group(1)), match.group(2), int(match.group(3)))] = op
            continue
        parsed = passes[index][1]
        own = [r for r in receives if op.start_s <= r.start_s <= op.start_s + op.duration_s]
        inputs = []
        for action in _actions(parsed):
            direction = "F" if action.kind == "F" else "B"
            recv_action = latest_recv.pop((action.stage, direction, action.microbatch), None)
            if recv_action is not None:
                inputs.extend(posted_in[id(recv_action)])
        found[index] = own if parsed.item is None else inputs
    return found


def _actions(parsed: PassName) -> tuple[Action, ...]:
    if parsed.item is None:
        return ()
    return (parsed.item.forward, parsed.item.backward) if isinstance(parsed.item, Overlapped) else (parsed.item,)


def _kernels_of(trace: Trace, passes: list[tuple[CpuOp, PassName, int]]) -> list[list[Kernel]]:
    """The kernels of each pass: launched under its annotation in its step, or by an op that
    started inside its span on another thread (the autograd engine's)."""
    found: list[list[Kernel]] = [[] for _ in passes]
    by_name: dict[tuple[int, str], int] = {}
    for index, (op, _, step) in enumerate(passes):
        by_name.setdefault((step, op.name), index)
    # passes do not nest: the one that may hold a time is the last to start before it
    spans = sorted((op.start_s, op.start_s + op.duration_s, index) for index, (op, _, _) in enumerate(passes))
    starts = [start for start, _, _ in spans]
    for kernel in trace.kernels:
        if kernel.collective is not None and kernel.collective.kind == "send-recv":
            continue
        owner = None
        if kernel.step is not None:
            owner = next((by_name[(kernel.step, name)] for name in kernel.op_names
                          if (kernel.step, name) in by_name), None)
        if owner is None and kernel.op is not None:
            position = bisect.bisect_right(starts, kernel.op.start_s) - 1
            if position >= 0 and kernel.op.start_s <= spans[position][1]:
                owner = spans[position][2]
        if owner is not None:
            found[owner].append(kernel)
    return found


def measure_passes(trace: Trace) -> list[MeasuredPass]:
    """Every pass annotation inside a profiler step of ``trace``, measured, in start order."""
    passes = []
    for op in trace.annotations:
        parsed = parse_pass(op.name)
        if parsed is None:
            continue
        step = _in_step(trace, op)
        if step is not None:
            passes.append((op, parsed, step))
    if not passes:
        return []
    measured = []
    if trace.kernels:
        for (op, parsed, step), kernels in zip(passes, _kernels_of(trace, passes)):
            spans = merged([(k.start_s, k.end_s) for k in kernels], float("-inf"), float("inf"))
            measured.append(MeasuredPass(op.name, parsed, step, op.start_s, op.start_s + op.duration_s,
                                         length(spans), 0.0, tuple(spans)))
        return measured
    receives = _input_receives(list(trace.annotations), [(op, parsed) for op, parsed, _ in passes])
    for index, (op, parsed, step) in enumerate(passes):
        end = op.start_s + op.duration_s
        arrived = max((r.start_s + r.duration_s for r in receives[index]), default=op.start_s)
        computing_from = min(max(arrived, op.start_s), end)
        measured.append(MeasuredPass(op.name, parsed, step, op.start_s, end, end - computing_from,
                                     computing_from - op.start_s, ((computing_from, end),)))
    return measured
