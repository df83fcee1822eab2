"""A scenario ties a cluster, a model and a parallel plan into one typed config tree."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from mpsim.specs.base import Spec
from mpsim.specs.calibration import CalibrationProfile
from mpsim.specs.faults import FaultsSpec
from mpsim.specs.model import ModelSpec, parse_model
from mpsim.specs.parallel import ParallelPlan, TrainingOptions
from mpsim.specs.reliability import ReliabilitySpec, VariabilitySpec
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
    faults: FaultsSpec = Field(default_factory=FaultsSpec,
                               description="slow GPUs, nodes and links (docs/heterogeneous.md)")
    variability: VariabilitySpec | None = Field(
        None, description="run-to-run variation of op times, for mpsim run --samples (docs/reliability.md)")
    reliability: ReliabilitySpec | None = Field(
        None, description="checkpoint storage, restart time and failure rates, for mpsim run --goodput "
                          "(docs/reliability.md)")

    @field_validator("model", mode="wrap")
    @classmethod
    def _model_kind(cls, value: Any, handler: Any) -> ModelSpec:
        """Transformer or layer stack by the model's ``kind`` field (transformer when absent)."""
        return parse_model(value)
