"""Cost models: compute ops on an accelerator, collectives on a topology, actions."""

from mpsim.cost.actions import ActionCost, CostModel, Segment, stage_costs

__all__ = ["ActionCost", "CostModel", "Segment", "stage_costs"]
