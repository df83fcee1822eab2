"""Which CPU ops enclosed each kernel launch: one sweep per CPU thread.

A kernel and the CUDA runtime call that launched it (``cudaLaunchKernel``, ``cudaMemcpyAsync``,
...) carry the same ``correlation`` id. The runtime call lies, in time, inside the CPU ops
and ``record_function`` annotations that were open on its thread when it ran; those are the
kernel's callers. (``External id`` is not a reliable link: in some traces a kernel's
``External id`` is its own correlation, not its op's.)

Finding them is an interval-stack sweep: per thread, the ops sorted by start (longest
first on a tie, so a parent comes before its child) and the runtime calls sorted by start
are walked together; the stack holds the ops open at the current time. Each runtime call
reads the stack: O(events x depth), not O(calls x ops).
"""

from __future__ import annotations


def enclosing_ops(ops: list[tuple[float, float, int]], launches: list[tuple[int, float]]) -> dict[int, tuple[int, ...]]:
    """For each launch ``(key, time_us)`` on one thread, the indices of the ``ops`` (same
    thread, each ``(start_us, end_us, index)``) that contain its time, outermost first;
    launches inside no op map to ``()``."""
    ordered_ops = sorted(ops, key=lambda op: (op[0], -op[1], op[2]))
    ordered_launches = sorted(launches, key=lambda launch: (launch[1], launch[0]))
    stack: list[tuple[float, float, int]] = []
    found: dict[int, tuple[int, ...]] = {}
    next_op = 0
    for key, time_us in ordered_launches:
        # open every op that starts at or before the launch (an op starting at the same
        # microsecond as the call encloses it: Kineto rounds both to the same tick)
        while next_op < len(ordered_ops) and ordered_ops[next_op][0] <= time_us:
            op = ordered_ops[next_op]
            while stack and stack[-1][1] < op[0]:
                stack.pop()
            stack.append(op)
            next_op += 1
        while stack and stack[-1][1] < time_us:
            stack.pop()
        # ops on one thread nest, but an annotation may overlap an op without nesting;
        # the filter keeps only those still open
        found[key] = tuple(op[2] for op in stack if op[1] >= time_us)
    return found
