"""A scenario ties a cluster, a model and a parallel plan into one typed config tree."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from mpsim.specs.base import Spec
from mpsim.specs.calibration import CalibrationProfile
from mpsim.specs.model import ModelSpec, parse_model
from mpsim.specs.parallel import ParallelPlan, TrainingOptions
from mpsim.specs.system import ClusterSpec


class Scenario(Spec):
    """Everything one simulation needs."""

    name: str
    description: str = ""
    cluster: ClusterSpec
    model: ModelSpec = Field(description="a transformer, or any layer stack (kind: stack)")
    parallel: ParallelPlan
    training: TrainingOptions = Field(default_factory=TrainingOptions)
    calibration: CalibrationProfile | None = Field(
        None, description="a calibration profile file (mpsim calibrate / validate) whose measurements replace the "
                          "datasheet efficiencies; see docs/calibration.md")

    @field_validator("model", mode="wrap")
    @classmethod
    def _model_kind(cls, value: Any, handler: Any) -> ModelSpec:
        """Transformer or layer stack by the model's ``kind`` field (transformer when absent)."""
        return parse_model(value)
