"""Many simulations at once: what-if sweeps and the layout planner.

* ``axes.py``, ``sweepfile.py``, ``sweep.py``: sweep syntax (grids, zips, ranges, the
  scenario file's ``sweep:`` block) and running a scenario over it;
* ``layouts.py``, ``planner.py``, ``planreport.py``: every valid layout of a model on a
  cluster, checked for memory, bounded, simulated, ranked and explained;
* ``runner.py``, ``progress.py``, ``store.py``: the one loop that runs points here, on
  all local cores or on Ray, with a progress bar and a resumable JSON-lines file;
* ``bounds.py``, ``memwalk.py``: a lower bound on the step (the engine's longest-path
  evaluator, ``mpsim/engine/longest_path.py``, gives the step itself), and a short schedule
  with the same activation peak;
* ``evaluate.py``: one point in, one record out; ``tables.py``, ``plots.py``: output.

See docs/explore.md for the commands and the results-file format.
"""

from mpsim.explore.planbase import base_scenario
from mpsim.explore.planner import plan
from mpsim.explore.pools import Session
from mpsim.explore.runner import run_points
from mpsim.explore.sweep import run_sweep

__all__ = ["Session", "base_scenario", "plan", "run_points", "run_sweep"]
