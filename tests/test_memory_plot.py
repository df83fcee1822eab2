"""The memory plot: labels that never overlap, and which ranks a deep pipeline's plot draws."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from mpsim.results.memory import RankMemory
from mpsim.results.memory_views import chosen_ranks, spread_labels


@given(st.lists(st.floats(-0.5, 1.5), min_size=1, max_size=40), st.floats(0.001, 0.2))
def test_spread_labels_keeps_labels_apart_in_order_and_in_range(wanted, pitch):
    placed = spread_labels(wanted, pitch)
    order = sorted(range(len(wanted)), key=lambda index: (wanted[index], index))
    heights = [placed[index] for index in order]
    fitting_pitch = min(pitch, 1 / max(1, len(wanted) - 1))
    assert all(0 - 1e-9 <= h <= 1 + 1e-9 for h in heights)
    assert all(b - a >= fitting_pitch - 1e-9 for a, b in pairwise(heights))


def test_spread_labels_leaves_labels_that_are_already_apart_where_they_are():
    assert spread_labels([0.1, 0.5, 0.9], 0.05) == [0.1, 0.5, 0.9]
    assert spread_labels([0.5, 0.5], 0.1) == [0.5, 0.6]


def _memory(peaks_gib: list[float]) -> list[RankMemory]:
    base = RankMemory(0, (0,), 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 80 * 2.0**30)
    return [replace(base, rank=rank, stages=(rank,), weights_bytes=peak * 2.0**30) for rank, peak in enumerate(peaks_gib)]


def test_a_deep_pipeline_draws_its_ends_middle_and_busiest_rank_with_why():
    peaks = [50.0] * 128
    peaks[37] = 70.0
    roles = chosen_ranks(_memory(peaks))
    assert roles == {0: ["first"], 1: ["second"], 37: ["highest peak"], 64: ["middle"], 126: ["second to last"],
                     127: ["last"]}
    peaks = [70.0] + [50.0] * 15
    assert chosen_ranks(_memory(peaks))[0] == ["first", "highest peak"]
