"""mpsim's prediction for the DTensor MLP check, and the check's verdict.

The prediction prices the MLP ops of one layer (``mlp.*`` without the norm and the
residual add: FC1, activation, FC2, their gradients, and under TP the all-reduces)
with the calibrated cost model, forward plus backward, once at TP = 1 and once at the
job's TP; the speed-up is their ratio. The scenarios have ``tp_comm_overlap_backward``
off, as DTensor runs the input-gradient all-reduce after the GEMMs, not beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.resolve import resolve
from mpsim.specs.calibration import CalibrationProfile
from mpsim.cost.actions import CostModel
from mpsim.specs.scenario import Scenario
from mpsim.workload import build_workload
from mpsim.workload.ops import Overlap

SKIPPED = (".norm", ".bda")


def mlp_seconds(scenario: Scenario, profile: CalibrationProfile) -> float:
    """Forward plus backward of one layer's MLP ops on one rank, with the profile's costs."""
    scenario = scenario.model_copy(update={"calibration": profile})
    layout = resolve(scenario)
    model = CostModel(scenario, layout)
    work = build_workload(scenario, layout).stages[0]
    total = 0.0
    for passes in (work.forward, work.backward):
        seen: set[str] = set()  # every layer is the same: price the first one's ops
        for block in passes:
            for item in block.items:
                ops = [item.comm, *item.compute] if isinstance(item, Overlap) else [item]
                for op in ops:
                    if not op.name.startswith("mlp.") or any(s in op.name for s in SKIPPED) or op.name in seen:
                        continue
                    seen.add(op.name)
                    total += model.collective_s(op) if op.kind == "collective" else model.compute.time(op)
    return total


@dataclass(frozen=True)
class TpCheck:
    """Measured and predicted seconds of the MLP block at TP = 1 and TP = ``tp``."""

    tp: int
    tokens: int
    measured_single_s: float
    measured_split_s: float
    predicted_single_s: float
    predicted_split_s: float
    foreign_cpu_share: float
    slowdown: float

    @property
    def measured_speedup(self) -> float:
        return self.measured_single_s / self.measured_split_s

    @property
    def predicted_speedup(self) -> float:
        return self.predicted_single_s / self.predicted_split_s

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_speedup - self.measured_speedup) / self.measured_speedup


def tp_check(raw: dict, single: Scenario, split: Scenario, profile: CalibrationProfile) -> TpCheck:
    """The verdict on the workers' TP measurement."""
    return TpCheck(raw["tp"], single.parallel.microbatch_size * single.model.seq_length,
                   raw["tp1"]["seconds"], raw["tpn"]["seconds"], mlp_seconds(single, profile),
                   mlp_seconds(split, profile), raw.get("foreign_cpu_share", 0.0), raw.get("slowdown", 1.0))
