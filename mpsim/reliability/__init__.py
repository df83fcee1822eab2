"""A whole training run rather than one perfect step: how much steps vary, and what failures cost.

Two ideas, each in its own modules:

* Variability (``op_variation.py``, ``sampling.py``, ``order_stats.py``): every op kind's
  time varies by a coefficient of variation; one step is re-run with seeded draws to give
  the step-time distribution of one data-parallel replica, and the job's step, which waits
  for the slowest replica, is the maximum over the replicas drawn from its order
  statistics, so the symmetry collapse stays intact.
* Failures (``failures.py``, ``goodput.py``): published interruption rates per component,
  checkpoint write and load times from the model state and a storage bandwidth, Daly's
  optimal checkpoint interval and the expected wall-clock time of a run with its lost
  time split into checkpoint writes, lost work and restarts.

``report.py`` prints and serializes both, ``plots.py`` draws them. docs/reliability.md
states the assumptions.
"""
