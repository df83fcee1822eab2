"""How a model decomposes into ops per rank, per stage, and what it keeps in memory.

:func:`build_workload` is the entry point: a transformer is built by ``stages.py``, any
layer stack by ``layer_stack.py``, both into the structures of ``stage_work.py``.
"""

from dataclasses import replace

from mpsim.specs.layout import Layout
from mpsim.specs.scenario import Scenario
from mpsim.workload.layer_stack import build_stack_workload
from mpsim.workload.stage_work import StageWork, Workload
from mpsim.workload.stages import build_transformer_workload


def build_workload(scenario: Scenario, layout: Layout) -> Workload:
    """Per-stage work for every model chunk of the layout (where FSDP under a pipeline gathers
    within the step, also the passes that gather first: ``Workload.unsharding``)."""
    build = build_stack_workload if scenario.model.kind == "stack" else build_transformer_workload
    workload = build(scenario, layout)
    if layout.fsdp_gathering is not None:
        workload = replace(workload, unsharding=build(scenario, layout, unsharding=True).stages)
    return workload


__all__ = ["StageWork", "Workload", "build_workload"]
