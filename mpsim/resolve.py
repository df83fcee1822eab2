"""The layout a simulation runs: the specs' rules first, then the prices ``auto`` needs.

:func:`mpsim.specs.resolve_layout` checks a plan against the model and the cluster the
way a framework does at start-up and fills in every derived number. One field cannot be
filled in from the specs alone: ``parallel.layers_per_stage: auto`` balances the stages
by what their layers cost, so it needs the cost model (``mpsim/balance/``). This module
is that second step of the main path; everything that simulates a scenario resolves its
layout here.
"""

from __future__ import annotations

from dataclasses import replace

from mpsim.balance.auto import balanced_layers
from mpsim.cost.devices import part_of_pp_ranks
from mpsim.specs.layout import Layout, resolve_layout
from mpsim.specs.scenario import Scenario


def resolve(scenario: Scenario, chains: tuple[int, ...] | None = None) -> Layout:
    """The checked layout, with ``layers_per_stage: auto`` balanced by the cost model.

    ``chains``: the schedule's stage chains when a schedule file says so (see
    :func:`mpsim.specs.resolve_layout`).
    """
    layout = resolve_layout(scenario, chains)
    scenario.faults.check_cluster(layout.devices, layout.devices_per_node)
    part_of_pp_ranks(scenario, layout)  # each part holds whole pipeline stages
    if layout.layer_split == "auto":
        # the provisional even split is a layout the cost model can price layer by layer
        counts, within_budget = balanced_layers(scenario, layout)
        layout = replace(layout, layers_per_chunk=counts, split_within_budget=within_budget)
    return layout
