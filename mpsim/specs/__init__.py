"""Input models (pydantic) and the loader that builds them from files."""

from mpsim.specs.accelerator import AcceleratorSpec
from mpsim.specs.layout import Layout, resolve_layout
from mpsim.specs.loader import LoadedScenario, load_scenario
from mpsim.specs.model import TransformerSpec
from mpsim.specs.parallel import ParallelPlan, TrainingOptions
from mpsim.specs.scenario import Scenario
from mpsim.specs.system import ClusterSpec, SystemSpec

__all__ = [
    "AcceleratorSpec", "ClusterSpec", "Layout", "LoadedScenario", "ParallelPlan", "Scenario",
    "SystemSpec", "TrainingOptions", "TransformerSpec", "load_scenario", "resolve_layout",
]
