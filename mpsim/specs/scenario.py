"""A scenario ties a cluster, a model and a parallel plan into one typed config tree."""

from __future__ import annotations

from pydantic import Field

from mpsim.calibrate.profile import CalibrationProfile
from mpsim.specs.base import Spec
from mpsim.specs.model import TransformerSpec
from mpsim.specs.parallel import ParallelPlan, TrainingOptions
from mpsim.specs.system import ClusterSpec


class Scenario(Spec):
    """Everything one simulation needs."""

    name: str
    description: str = ""
    cluster: ClusterSpec
    model: TransformerSpec
    parallel: ParallelPlan
    training: TrainingOptions = Field(default_factory=TrainingOptions)
    calibration: CalibrationProfile | None = Field(
        None, description="a calibration profile file (mpsim calibrate / validate) whose measurements replace the "
                          "datasheet efficiencies; see docs/calibration.md")
