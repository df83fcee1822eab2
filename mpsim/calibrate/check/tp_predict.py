"""mpsim's prediction for the MLP tensor-parallel check, and the check's verdict, per MLP width.

The check measures the split written out the Megatron way (what mpsim models) and,
beside it, through DTensor, which is reported but not predicted
(``mpsim/calibrate/measure/tp_check.py`` says why). The prediction prices the MLP ops
of one layer (``mlp.*`` without the norm and the residual add: FC1, activation, FC2,
their gradients, and under TP the all-reduces) with the calibrated cost model, forward
plus backward, once at TP = 1 and once at the job's TP; the speed-up is their ratio.
The scenarios have ``tp_comm_overlap_backward`` off, as both splits run the
input-gradient all-reduce after the GEMMs, not beside them.
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
    hidden: int
    ffn_hidden: int
    measured_single_s: float
    measured_split_s: float
    predicted_single_s: float
    predicted_split_s: float
    foreign_cpu_share: float
    slowdown: float
    measured_dtensor_s: float | None = None  # the same split through DTensor (not what mpsim models)

    @property
    def measured_speedup(self) -> float:
        return self.measured_single_s / self.measured_split_s

    @property
    def dtensor_speedup(self) -> float | None:
        return None if self.measured_dtensor_s is None else self.measured_single_s / self.measured_dtensor_s

    @property
    def dtensor_overhead_s(self) -> float | None:
        """What DTensor adds to the written-out split, per forward+backward of the block."""
        return None if self.measured_dtensor_s is None else self.measured_dtensor_s - self.measured_split_s

    @property
    def predicted_speedup(self) -> float:
        return self.predicted_single_s / self.predicted_split_s

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_speedup - self.measured_speedup) / self.measured_speedup


def tp_check(raw: dict, single: Scenario, split: Scenario, profile: CalibrationProfile) -> TpCheck:
    """The verdict on the workers' TP measurement of one MLP width."""
    return TpCheck(raw["tp"], single.parallel.microbatch_size * single.model.seq_length, single.model.hidden_size,
                   single.model.ffn_hidden_size, raw["tp1"]["seconds"], raw["tpn"]["seconds"],
                   mlp_seconds(single, profile), mlp_seconds(split, profile), raw.get("foreign_cpu_share", 0.0),
                   raw.get("slowdown", 1.0), raw["dtensor"]["seconds"] if "dtensor" in raw else None)


def tp_checks(raws: list[dict], pairs: list[tuple[Scenario, Scenario]], profile: CalibrationProfile) -> list[TpCheck]:
    """The verdict on every MLP width the workers measured, in the plan's order (the model's own first)."""
    if len(raws) != len(pairs):
        raise ValueError(f"the TP check measured {len(raws)} widths for {len(pairs)} planned")
    checks = []
    for raw, (single, split) in zip(raws, pairs):
        if raw.get("hidden") != single.model.hidden_size:
            raise ValueError(f"the TP check measured hidden {raw.get('hidden')} where hidden "
                             f"{single.model.hidden_size} was planned")
        checks.append(tp_check(raw, single, split, profile))
    return checks
