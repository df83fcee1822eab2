"""The Python interface: the main path as a few calls for notebooks and scripts.

``load`` reads a scenario (a file or the name of a shipped one) with overrides;
``simulate`` runs the chain ``mpsim run`` runs (the step, the bubble reference run, the
summary) and returns a :class:`Result` whose summary is the one ``mpsim run --json``
prints; ``compare``, ``sweep`` and ``plan`` do what the commands of the same names do.
Nothing here computes a number of its own: it wires the layers below together and
shows what they return, as a table in Jupyter or a pandas data frame on request
(docs/api.md).

Every import of the simulator happens inside a function, so ``import mpsim`` stays as
fast as it was before the interface existed; ``mpsim.load`` and the others are
imported from here on first use.
"""

from mpsim.api.explore import Comparison, Exploration, compare, plan, sweep
from mpsim.api.result import Result
from mpsim.api.scenarios import load, override_texts, simulate

__all__ = ["Comparison", "Exploration", "Result", "compare", "load", "override_texts", "plan", "simulate", "sweep"]
