"""The engine: runs per-rank action lists with given durations and records a timeline.

Two evaluators of the same :class:`EngineInput` give the same :class:`Timeline`: the SimPy
engine (``core.py``, the reference, with links shared between concurrent transfers) and
the longest-path evaluator (``longest_path.py``, faster, for inputs whose every resource
has one writer; ``supports`` tells which), which ``steady.py`` runs with the repeated middle of a
pipeline skipped where it repeats exactly, and ``compiled.py`` runs as one compiled loop (numba).
``excise.py`` runs the SimPy engine over a step with its exactly repeated middle cut out and
puts the repeats back into the timeline.
"""

from mpsim.engine.compiled import simulate_compiled
from mpsim.engine.core import EngineInput, GradBucket, simulate
from mpsim.engine.longest_path import rank_spans, simulate_fast, supports
from mpsim.engine.steady import SteadyTimeline, simulate_steady
from mpsim.engine.timeline import ActionRecord, SyncRecord, Timeline, TransferRecord

__all__ = ["ActionRecord", "EngineInput", "GradBucket", "SyncRecord", "Timeline", "TransferRecord", "rank_spans",
           "simulate", "simulate_compiled", "simulate_fast", "simulate_steady", "SteadyTimeline", "supports"]
