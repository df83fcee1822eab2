"""Links shared by concurrent transfers: processor sharing in the engine."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from mpsim.engine.links import SharedLinks
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from tests.conftest import SCENARIOS

sizes = st.floats(min_value=1e-3, max_value=10.0, allow_nan=False, allow_infinity=False)


def finish_times(flows: list[tuple[float, float, tuple]]) -> list[float]:
    """Run flows (start, size, links) and return when each finished."""
    env = simpy.Environment()
    shared = SharedLinks(env)
    ends = [0.0] * len(flows)

    def starter(index, start, size, links):
        yield env.timeout(start)
        yield shared.wait(size, links)
        ends[index] = env.now

    for index, flow in enumerate(flows):
        env.process(starter(index, *flow))
    env.run()
    return ends


@settings(max_examples=200, deadline=None)
@given(sizes, sizes)
def test_two_transfers_on_one_link_take_the_sum_of_their_sizes(a, b):
    ends = finish_times([(0.0, a, ("nic",)), (0.0, b, ("nic",))])
    assert max(ends) == pytest.approx(a + b, rel=1e-9)
    assert min(ends) == pytest.approx(2 * min(a, b), rel=1e-9)  # equal shares until the smaller is done


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), sizes), min_size=1, max_size=6))
def test_a_shared_link_is_work_conserving(flows):
    """However flows arrive, the link is never idle while one is active, so the last ends at
    max over arrival points t of (t + work still to do from flows starting at or after t)."""
    ends = finish_times([(start, size, ("link",)) for start, size in flows])
    starts = sorted({start for start, _ in flows})
    expected = 0.0
    for t in starts:
        expected = max(expected, t + sum(size for start, size in flows if start >= t))
    assert max(ends) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    for (start, size), end in zip(flows, ends):
        assert end >= start + size - 1e-9  # never faster than alone


@settings(max_examples=100, deadline=None)
@given(sizes, sizes)
def test_transfers_on_different_links_do_not_interact(a, b):
    assert finish_times([(0.0, a, ("x",)), (0.0, b, ("y",))]) == pytest.approx([a, b])


def test_a_flow_over_two_links_moves_at_its_most_shared_link():
    # c shares "out" with a, and "in" with b and d: it gets a third of "in"
    ends = finish_times([(0.0, 1.0, ("out",)), (0.0, 1.0, ("in",)), (0.0, 1.0, ("in",)),
                         (0.0, 1.0, ("out", "in"))])
    assert ends[3] == pytest.approx(3.0)



@settings(max_examples=200, deadline=None)
@given(sizes, sizes, st.floats(0.0, 1.0))
def test_a_process_waiting_on_a_flows_timer_wakes_when_it_lands(a, b, fraction):
    """The engine's ranks wait for a transfer by yielding its flow's timer, which is replaced
    when the rate changes: a flow that speeds up must still wake them when it lands."""
    env = simpy.Environment()
    shared = SharedLinks(env)
    landed, woke = [], []
    other = shared.transfer(a, ("nic",), lambda: None)
    flow = shared.transfer(b, ("nic",), lambda: landed.append(env.now))

    def waiter():
        yield env.timeout(fraction * min(a, b))  # start waiting while both share the link
        while not landed:
            yield flow.timer
        woke.append(env.now)

    env.process(waiter())
    env.run()
    assert other is not None and woke == landed == [pytest.approx(b + min(a, b), rel=1e-9)]


@settings(max_examples=200, deadline=None)
@given(st.lists(sizes, min_size=1, max_size=5), sizes, st.floats(0.0, 20.0))
def test_a_tracked_flow_passes_its_parts_when_separate_flows_would_end(parts, other_size, other_start):
    """A flow of several back-to-back parts (the DP stream's buckets) passes each part when
    the parts sent one after another would have ended, whatever else shares the link."""

    def run(send):
        env = simpy.Environment()
        shared = SharedLinks(env)

        def competitor():
            yield env.timeout(other_start)
            yield shared.wait(other_size, ("nic",))

        env.process(competitor())
        result = send(env, shared)
        env.run()
        return result

    def one_at_a_time(env, shared):
        ends = []

        def sender():
            for part in parts:
                yield shared.wait(part, ("nic",))
                ends.append(env.now)

        env.process(sender())
        return ends

    cumulative = [sum(parts[:i + 1]) for i in range(len(parts))]

    def as_one_flow(env, shared):
        landed = []
        flow = shared.transfer(cumulative[-1], ("nic",), lambda: landed.append(env.now), track=True)
        return flow, landed

    separate = run(one_at_a_time)
    flow, landed = run(as_one_flow)
    assert landed == [pytest.approx(separate[-1], rel=1e-9)]
    assert flow.passed_at(cumulative, landed[0]) == pytest.approx(separate, rel=1e-9)

def step(path, *overrides):
    return simulate(load_scenario(path, list(overrides)).scenario).timeline.step_time_s


def test_pipeline_sends_and_dp_buckets_share_the_nic():
    # TP 8 x PP 4 x DP 2 on 8 nodes: pipeline neighbours and DP peers are on other nodes
    overrides = ["cluster.nodes=8", "cluster.system.scale_out.nic_bandwidth=100 Gb/s"]
    path = SCENARIOS / "llama3_70b_32xh100.yaml"
    alone = step(path, *overrides, "training.network_contention=false")
    shared = step(path, *overrides)
    assert shared > alone  # DP gradient buckets slow the pipeline transfers on the same NICs


@pytest.mark.parametrize("field,value", [("cluster.system.scale_out.nic_bandwidth", "800 Gb/s"),
                                         ("cluster.system.scale_up.bandwidth_per_device", "900 GB/s")])
def test_more_bandwidth_is_never_slower_with_contention(field, value):
    path = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
    assert step(path, f"{field}={value}") <= step(path) + 1e-12


def test_flows_that_land_together_are_recorded_in_the_same_order_every_run():
    # Grok-1-like's expert all-to-all and DP buckets put several flows on one NIC that land
    # at the same instant; their order must not depend on where the flows sit in memory
    scenario = load_scenario(SCENARIOS / "grok1_like_512xh100.yaml").scenario
    runs = [simulate(scenario).timeline.transfers for _ in range(4)]
    assert all(transfers == runs[0] for transfers in runs[1:])
