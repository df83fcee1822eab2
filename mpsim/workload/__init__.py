"""How a model decomposes into ops per rank, per stage, and what it keeps in memory."""

from mpsim.workload.stages import StageWork, Workload, build_workload

__all__ = ["StageWork", "Workload", "build_workload"]
