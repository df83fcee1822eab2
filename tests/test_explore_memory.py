"""The planner's shortened memory walk finds the full walk's activation peak, whatever the bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine import rank_spans
from mpsim.explore.memwalk import distinct_items, memory_schedule
from mpsim.results.memory import activation_walk
from mpsim.schedules import SCHEDULES, ScheduleError, build_schedule
from mpsim.schedules.actions import flat
from tests.conftest import registered_schedule

sizes = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def schedules(draw):
    name = draw(st.sampled_from(sorted(SCHEDULES)))
    low = max(1, getattr(SCHEDULES[name], "min_vpp", 1))
    high = getattr(SCHEDULES[name], "max_vpp", 3) or 3
    pp, vpp, micro = draw(st.integers(1, 6)), draw(st.integers(low, max(low, min(high, 4)))), draw(st.integers(1, 16))
    return registered_schedule(name, pp, vpp, micro)


def workload(draw, stages: int) -> SimpleNamespace:
    return SimpleNamespace(stages=[SimpleNamespace(activation_bytes=draw(sizes), weight_grad_buffer_bytes=draw(sizes),
                                                   layer_activation_bytes=0.0) for _ in range(stages)])


@settings(max_examples=300, deadline=None)
@given(schedules(), st.data())
def test_short_walk_has_the_full_walks_peak(schedule, data):
    work = workload(data.draw, schedule.num_stages)
    short = memory_schedule(schedule)
    for rank in range(schedule.num_ranks):
        full_peak, _ = activation_walk(schedule, rank, work)
        short_peak, _ = activation_walk(short, rank, work)
        assert abs(short_peak - full_peak) <= 1e-9 * max(1.0, full_peak)
        assert len(short.actions[rank]) <= len(flat(schedule.actions[rank]))


def test_short_walk_is_much_shorter_for_a_long_1f1b():
    schedule = build_schedule("1f1b", 8, 1, 256)
    short = memory_schedule(schedule)
    assert sum(len(a) for a in short.actions) * 20 < sum(len(a) for a in schedule.actions)


@settings(max_examples=100, deadline=None)
@given(schedules())
def test_distinct_items_keep_every_duration_key(schedule):
    from mpsim.engine.core import duration_key

    short = distinct_items(schedule)
    assert {duration_key(i) for r in short.actions for i in r} == \
        {duration_key(i) for r in schedule.actions for i in r}


# the loops the array versions replaced, kept as the reference they must agree with action for action
def _loop_memory_schedule(schedule):
    from dataclasses import replace

    ranks = []
    for rank, items in enumerate(schedule.actions):
        stages = tuple(s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank)
        actions, slot, width = flat(items), {stage: i for i, stage in enumerate(stages)}, len(stages)
        state, states = [0] * (2 * width), []
        for action in actions:
            i = slot[action.stage]
            if action.kind in ("F", "B", "I"):
                state[i] += 1 if action.kind == "F" else -1
            if action.kind in ("I", "W"):
                state[width + i] += 1 if action.kind == "I" else -1
            states.append(tuple(state))
        wanted = {state for index, (state, action) in enumerate(zip(states, actions))
                  if action.kind in ("F", "I") and (index + 1 == len(actions) or actions[index + 1].kind != "F")}
        kept, start, anchor = [], 0, (0,) * (2 * width)
        for index, now in enumerate(states):
            if now in wanted:
                wanted.discard(now)
                kept.extend(actions[start:index + 1])
                start, anchor = index + 1, now
                if not wanted:
                    break
            elif now == anchor:
                start = index + 1
        ranks.append(tuple(kept))
    return replace(schedule, actions=tuple(ranks))


def _loop_distinct_and_counts(schedule):
    from collections import Counter

    from mpsim.engine.core import duration_key

    seen, ranks = set(), []
    for items in schedule.actions:
        kept = []
        for item in items:
            if duration_key(item) not in seen:
                seen.add(duration_key(item))
                kept.append(item)
        ranks.append(tuple(kept))
    counts = []
    for rank, items in enumerate(schedule.actions):
        keys = [duration_key(item) for item in items]
        backward = [i for i, key in enumerate(keys) if key[-1] in ("B", "I")]
        last = backward[-1] if backward else -1
        # each stage's last backward or weight pass on the rank, latest first
        completing, done = [], set()
        for position in reversed(range(len(items))):
            for action in flat([items[position]]):
                if action.kind in ("B", "W") and schedule.stage_to_rank[action.stage] == rank \
                        and action.stage not in done:
                    done.add(action.stage)
                    completing.append((action.stage, keys[position], Counter(keys[position + 1:])))
        counts.append((items[0] if items else None, items[last] if backward else None, Counter(keys[last + 1:]),
                       Counter(keys), tuple(completing)))
    return ranks, counts


def _agree_with_the_loops(schedule):
    from mpsim.explore.bounds import rank_counts, rank_counts_of_read
    from mpsim.explore.memwalk import ScheduleRead, distinct_of_read

    assert memory_schedule(schedule) == _loop_memory_schedule(schedule)
    ranks, counts = _loop_distinct_and_counts(schedule)
    assert distinct_items(schedule).actions == tuple(ranks)

    def ordered(found):  # in the same order too: the bound sums its busy time in the Counter's order
        return [(first, last, list(after.items()), list(per_key.items()),
                 [(stage, key, list(later.items())) for stage, key, later in made])
                for first, last, after, per_key, made in found]

    assert ordered(rank_counts(schedule)) == ordered(counts)
    read = ScheduleRead.of(schedule)
    if read.plain:  # the array forms the planner reads schedules without overlapped pairs with
        assert distinct_of_read(schedule, read).actions == tuple(ranks)
        assert ordered(rank_counts_of_read(schedule, read)) == ordered(counts)


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_array_reads_keep_the_loops_actions(schedule):
    _agree_with_the_loops(schedule)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_array_reads_keep_the_loops_actions_on_longer_schedules(name):
    for pp, vpp, micro in ((4, 2, 24), (8, 3, 32), (8, 1, 64), (16, 2, 48)):
        try:
            schedule = build_schedule(name, pp, vpp, micro, timer=rank_spans)
        except ScheduleError:
            continue
        _agree_with_the_loops(schedule)
