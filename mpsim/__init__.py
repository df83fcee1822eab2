"""mpsim: a discrete-event simulator for model-parallel training.

The main path (see docs/architecture.md): a scenario file -> :func:`mpsim.specs.load_scenario`
-> :func:`mpsim.simulate.simulate` -> :func:`mpsim.results.summarize`.
"""

__version__ = "0.1.0"
