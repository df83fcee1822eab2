"""PyTorch profiler (Kineto) traces of real GPU runs, read into plain data.

``load_trace(path)`` reads one rank's file; ``load_traces(paths)`` files or folders of
ranks. ``summarize(trace)`` (``summary.py``) turns a trace into per-step busy time,
GEMM shapes, collectives and overlap. The data model is in ``model.py``.
"""

from mpsim.traces.model import CATEGORIES, Collective, CpuOp, Gemm, Kernel, Step, Trace
from mpsim.traces.read import load_trace, load_traces

__all__ = ["CATEGORIES", "Collective", "CpuOp", "Gemm", "Kernel", "Step", "Trace", "load_trace", "load_traces"]
