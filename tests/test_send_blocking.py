"""Blocking pipeline sends (``training.pp_send_blocking``): before every next action (Megatron's
batched p2p), before the next action that receives an input only (``with-receive``: the Zero
Bubble fork, which batches a pass's sends with the receive the next pass consumes), or never."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from mpsim.engine import simulate
from mpsim.engine.longest_path import simulate_fast
from mpsim.errors import InputError
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS, load_benchmark
from tests.test_engine_longest_path import assert_same_timeline, engine_inputs

SLACK = 1e-9


def modes(inp):
    """``inp`` with no blocking sends, blocking before an action that receives, and before every action."""
    return (dataclasses.replace(inp, send_blocking=False, send_blocking_with_receive=False),
            dataclasses.replace(inp, send_blocking=True, send_blocking_with_receive=True),
            dataclasses.replace(inp, send_blocking=True, send_blocking_with_receive=False))


@settings(max_examples=60, deadline=None)
@given(engine_inputs())
def test_waiting_for_fewer_sends_is_never_slower(inp):
    # delays only add in a max-plus system: each mode waits at a subset of the next one's points
    never, with_receive, always = (simulate_fast(x).step_time_s for x in modes(inp))
    assert never <= with_receive * (1 + SLACK) + 1e-12
    assert with_receive <= always * (1 + SLACK) + 1e-12


@settings(max_examples=60, deadline=None)
@given(engine_inputs())
def test_only_an_action_that_receives_waits_for_the_sends(inp):
    _, with_receive, _ = modes(inp)
    timeline = simulate(with_receive)
    assert_same_timeline(with_receive, timeline)  # the longest path walks the same waits
    last_end = [records[-1].end_s if records else 0.0 for records in timeline.actions]
    for rank, _, until in timeline.send_waits:
        # the wait ends where an action that receives becomes ready, or after the rank's last
        # action (the sends still in flight then)
        receivers = [r for r in timeline.actions[rank] if r.ready_s == until and r.input_sent_s is not None]
        assert receivers or until >= last_end[rank], (rank, until)


def test_the_zero_bubble_forks_schedules_wait_with_their_receives():
    zb = load_benchmark("published_zero_bubble")
    shape = zb.setups(load_benchmark("published_common").DATA)["6.2B"]

    def blocking(schedule):
        overrides = zb.zero_bubble_overrides("6.2B", shape, 8, 1, 3, 24, schedule)
        return load_scenario(zb.ZB_BASE, overrides).scenario.training.pp_send_blocking

    # Megatron's batched p2p; the interleaved schedule's overlapped p2p, waited for one action later;
    # the fork's batches of a pass's sends with the next pass's receive
    assert [blocking(s) for s in ("1F1B", "1F1B-I", "ZB-1p", "ZB-2p", "ZB-V")] == \
        [True, False, "with-receive", "with-receive", "with-receive"]


@pytest.mark.parametrize("value", ["maybe", "1", "2"])
def test_a_send_blocking_that_is_not_one_of_the_three_is_refused(value):
    with pytest.raises(InputError) as error:
        load_scenario(SCENARIOS / "llama3_70b_32xh100.yaml", [f"training.pp_send_blocking={value}"])
    assert "training.pp_send_blocking" in str(error.value)
    assert "with-receive" in str(error.value)
