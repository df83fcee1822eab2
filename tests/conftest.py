"""Shared helpers: paths and a uniform-cost engine input builder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from mpsim.engine import EngineInput
from mpsim.schedules import Schedule

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

# a 1.3B GPT: small enough that every layout fits on 8 A100 and a whole plan runs in seconds
TINY_MODEL = """\
name: gpt-1.3b
num_layers: 24
hidden_size: 2048
ffn_hidden_size: 8192
num_attention_heads: 16
vocab_size: 51200
seq_length: 2048
"""


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (once), its sibling modules importable as it imports them.

    Registered under its own name before it runs: dataclasses defined in it look their
    module up by that name.
    """
    if name not in sys.modules:
        benchmarks = str(ROOT / "benchmarks")
        if benchmarks not in sys.path:
            sys.path.insert(0, benchmarks)
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def uniform_input(schedule: Schedule, forward_s: float = 1.0, backward_s: float = 2.0, weight_s: float | None = None,
                  transfer_s: float = 0.0, **options) -> EngineInput:
    """Engine input where every stage costs the same (the closed-form bubble setting)."""
    weight_s = backward_s / 2 if weight_s is None else weight_s
    action_s = {}
    for stage in range(schedule.num_stages):
        action_s[(stage, "F")] = forward_s
        action_s[(stage, "B")] = backward_s
        action_s[(stage, "I")] = backward_s - weight_s
        action_s[(stage, "W")] = weight_s
    transfers = {}
    for stage in range(schedule.num_stages - 1):
        transfers[(stage, stage + 1)] = transfers[(stage + 1, stage)] = transfer_s
    return EngineInput(schedule=schedule, action_s=action_s, transfer_s=transfers, **options)


@pytest.fixture
def scenarios_dir() -> Path:
    return SCENARIOS
