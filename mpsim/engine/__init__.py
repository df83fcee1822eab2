"""SimPy engine: runs per-rank action lists with given durations and records a timeline."""

from mpsim.engine.core import EngineInput, GradBucket, simulate
from mpsim.engine.timeline import ActionRecord, SyncRecord, Timeline, TransferRecord

__all__ = ["ActionRecord", "EngineInput", "GradBucket", "SyncRecord", "Timeline", "TransferRecord", "simulate"]
