"""Pipeline load balancing: which layers go to which stage (``parallel.layers_per_stage: auto``).

``partition.py`` is the algorithm on plain numbers; ``auto.py`` prices a scenario's
layers with the cost model and hands them to it.
"""

from mpsim.balance.partition import PartitionProblem, balance, bottleneck_s, exhaustive

__all__ = ["PartitionProblem", "balance", "bottleneck_s", "exhaustive"]
