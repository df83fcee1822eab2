"""The bidirectional DualPipe (DeepSeek-V3 Sec. 3.2.1): two chains of stages over the same blocks."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mpsim.cli import main
from mpsim.errors import EXIT_OUT_OF_MEMORY
from mpsim.cost.actions import CostModel
from mpsim.cost.step import final_grad_buckets
from mpsim.engine import EngineInput, simulate as run_engine
from mpsim.errors import InputError
from mpsim.explore.bounds import forward_heads
from mpsim.results import summarize
from mpsim.schedules import ScheduleError, build_schedule, flat, schedule_from_text, validate
from mpsim.schedules.validate import dependencies
from mpsim.simulate import simulate
from mpsim.specs import load_scenario
from mpsim.specs.layout import resolve_layout
from tests.conftest import SCENARIOS, uniform_input

LLAMA = SCENARIOS / "llama3_70b_32xh100.yaml"
LLAMA_DP = SCENARIOS / "llama3_8b_64xh100_dp8.yaml"
GRID = [(p, m) for p in (2, 4, 6, 8) for m in (2 * p, 2 * p + 2, 3 * p + (3 * p) % 2, 4 * p)]


@pytest.mark.parametrize("p,m", GRID)
def test_every_stage_and_microbatch_runs_once_on_its_chain(p, m):
    schedule = build_schedule("dualpipe", p, 2, m, check=True)  # also the deadlock dry run
    assert schedule.chains == (p, p)
    assert schedule.stage_to_rank == tuple(range(p)) + tuple(reversed(range(p)))
    counts = Counter(flat(action for rank in schedule.actions for action in rank))
    assert all(n == 1 for n in counts.values())
    half = m // 2
    for stage in range(2 * p):
        carried = range(half) if stage < p else range(half, m)  # half the microbatches enter from each end
        seen = {a.microbatch for a in counts if a.stage == stage}
        assert seen == set(carried)
        for mb in carried:
            forward = counts[(stage, "F", mb)]
            full, inp, weight = (counts[(stage, kind, mb)] for kind in "BIW")
            assert forward == 1 and (full, inp, weight) in ((1, 0, 0), (0, 1, 1))


@pytest.mark.parametrize("p,m", [(4, 8), (6, 18), (8, 16)])
def test_mirrored_ranks_run_the_same_program_with_directions_swapped(p, m):
    schedule = build_schedule("dualpipe", p, 2, m)
    half = m // 2

    def swap(action):
        # block k of direction 0 (stage k) <-> block k of direction 1 (stage p + k)
        stage = action.stage + p if action.stage < p else action.stage - p
        return (stage, action.kind, (action.microbatch + half) % m)

    for rank in range(p):
        mine = [swap(a) for a in flat(schedule.actions[rank])]
        assert mine == [tuple(a) for a in flat(schedule.actions[p - 1 - rank])]


def test_dependencies_stop_at_chain_boundaries():
    schedule = build_schedule("dualpipe", 4, 2, 8)
    chains = schedule.topology
    assert dependencies((4, "F", 4), chains) == []  # direction 1 starts on rank 3: no stage 3 before it
    assert dependencies((3, "B", 0), chains) == [(3, "F", 0)]  # stage 3 computes direction 0's loss
    assert dependencies((5, "F", 4), chains) == [(4, "F", 4)]
    assert [chains.block(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_text_round_trip_keeps_the_chains():
    schedule = build_schedule("dualpipe", 4, 2, 8)
    text = schedule.to_text()
    assert text.startswith("# chains: 4 4\n") and "OVERLAP_F_B" in text
    again = schedule_from_text(text, name="dualpipe")
    assert again == schedule
    # without the directive the same lists are one chain of 8 stages, which they do not cover
    with pytest.raises(ScheduleError):
        validate(schedule_from_text(text.split("\n", 1)[1]))


@pytest.mark.parametrize("p,vpp,m,fragment", [
    (3, 2, 12, "parallel.pp must be even"),
    (4, 2, 6, "at least 2 x pp = 8"),
    (4, 2, 10 + 1, "even number"),
    (4, 1, 8, "set parallel.vpp to 2"),
])
def test_layouts_dualpipe_cannot_run_are_rejected(p, vpp, m, fragment):
    with pytest.raises(ScheduleError, match=fragment):
        build_schedule("dualpipe", p, vpp, m)


def test_cli_rejects_an_odd_pipeline_naming_the_field(capsys):
    code = main(["run", str(LLAMA), "--set", "parallel.schedule=dualpipe", "--set", "parallel.vpp=2",
                 "--set", "parallel.global_batch_size=6"])
    assert code == 2
    err = capsys.readouterr().err
    assert "parallel.schedule" in err and "global_batch_size" in err
    assert main(["schedule", "dualpipe", "--pp", "3", "--vpp", "2", "--microbatches", "12"]) == 2
    assert "parallel.pp" in capsys.readouterr().err


def stage_idle(p: int, m: int, f: float, i: float, w: float, name: str = "dualpipe") -> float:
    """Largest (span - busy) over ranks with uniform costs and free communication."""
    schedule = build_schedule(name, p, 2, m, check=True)
    inp = uniform_input(schedule, forward_s=f, backward_s=i + w, weight_s=w)
    pairs = {}
    for rank in schedule.actions:
        for item in rank:
            if hasattr(item, "forward"):  # an overlapped F&B step lasts a forward plus a full backward
                pairs[(item.forward.stage, "F", item.backward.stage, item.backward.kind)] = f + i + w
    timeline = run_engine(EngineInput(schedule, {**inp.action_s, **pairs}, {}))
    return max((r[-1].end_s - r[0].start_s) - sum(x.end_s - x.start_s for x in r) for r in timeline.actions)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("m_factor", [2, 3, 4])
@pytest.mark.parametrize("f,i,w", [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.5, 1.5, 0.5)])
def test_bubble_matches_deepseek_table_2(p, m_factor, f, i, w):
    # DeepSeek-V3 Table 2, DualPipe: (PP/2 - 1)(F&B + B - 3W) with PP the ranks, F&B = F + B,
    # B the full backward; exact here when the forward and the input-gradient half are equal
    pair, full_backward = f + i + w, i + w
    assert stage_idle(p, m_factor * p, f, i, w) == pytest.approx((p / 2 - 1) * (pair + full_backward - 3 * w))


@pytest.mark.parametrize("f,i,w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 2.0)])
def test_bubble_equals_dualpipev_on_half_the_ranks(f, i, w):
    # each half of DualPipe's ranks runs DualPipeV's program for p/2 ranks and m/2 microbatches
    assert stage_idle(8, 24, f, i, w) == pytest.approx(stage_idle(4, 12, f, i, w, name="dualpipev"))


@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_activations_in_flight_are_pp_plus_one(p):
    # DeepSeek-V3 Table 2: PP + 1 microbatches of a stage's activations on every rank
    schedule = build_schedule("dualpipe", p, 2, 3 * p + (3 * p) % 2)
    for actions in schedule.actions:
        held = most = 0
        for action in flat(actions):
            held += {"F": 1, "B": -1, "I": -1}.get(action.kind, 0)
            most = max(most, held)
        assert most == p + 1


def _simulated(schedule: str, *extra: str, path=LLAMA):
    sets = [f"parallel.schedule={schedule}", "parallel.vpp=" + ("1" if schedule == "1f1b" else "2"), *extra]
    return simulate(load_scenario(path, sets).scenario)


def test_blocks_embedding_and_heads_follow_the_chains():
    result = _simulated("dualpipe", "parallel.global_batch_size=8")
    stages = result.workload.stages
    assert [s.has_embedding for s in stages] == [True, False, False, False] * 2
    assert [s.has_head for s in stages] == [False, False, False, True] * 2
    assert result.layout.layers_per_chunk == (20,) * 8  # 80 layers in 4 blocks, each held twice
    given = _simulated("dualpipe", "parallel.global_batch_size=8", "parallel.layers_per_stage=[18,21,21,20]")
    assert given.layout.layers_per_chunk == (18, 21, 21, 20) * 2
    assert given.workload.stages[4].layers == 18 and given.workload.stages[4].has_embedding
    with pytest.raises(InputError, match="one per layer block of dualpipe: 4"):
        resolve_layout(load_scenario(LLAMA, ["parallel.schedule=dualpipe", "parallel.vpp=2",
                                             "parallel.layers_per_stage=[10,10,10,10,10,10,10,10]"]).scenario)
    with pytest.raises(InputError, match="auto balancing"):
        resolve_layout(load_scenario(LLAMA, ["parallel.schedule=dualpipe", "parallel.vpp=2",
                                             "parallel.layers_per_stage=auto"]).scenario)


def test_parameters_per_rank_are_twice_one_f_one_b():
    dual = summarize(_simulated("dualpipe", "parallel.global_batch_size=8"))
    base = summarize(_simulated("1f1b", "parallel.global_batch_size=8"))
    p = len(base.memory)
    for rank in range(p):
        # rank r holds block r and block p-1-r, each with its embedding or head
        assert dual.memory[rank].params == pytest.approx(base.memory[rank].params + base.memory[p - 1 - rank].params)
    for rank in range(1, p - 1):  # middle ranks: two identical blocks
        assert dual.memory[rank].params == pytest.approx(2 * base.memory[rank].params)
        assert dual.memory[rank].weights_bytes == pytest.approx(2 * base.memory[rank].weights_bytes)
        assert dual.memory[rank].optimizer_bytes == pytest.approx(2 * base.memory[rank].optimizer_bytes)


def test_block_copies_reduce_gradients_over_twice_the_dp_ranks():
    result = _simulated("dualpipe", "parallel.pp=4", "parallel.dp=2", "parallel.global_batch_size=16", path=LLAMA_DP)
    layout = result.layout
    assert layout.dp > 1
    model = CostModel(result.scenario, layout)
    work = result.workload.stages[1]
    alone = final_grad_buckets(work, model)
    joined = final_grad_buckets(work, model, (1, 2))
    assert len(alone) == len(joined) and alone
    assert joined[0][3].size == 2 * model.placements["dp"].size
    assert sum(b[1] for b in joined) > sum(b[1] for b in alone)  # a larger group, across pipeline ranks
    # the engine joins ranks holding the same blocks: 0 with 3, 1 with 2
    joins = {(a, b) for a, b, seconds, _ in result.engine_input.pair_syncs if seconds == 0}
    assert joins == {(0, 3), (1, 2)}


def test_forward_heads_restart_at_each_chain():
    schedule = build_schedule("dualpipe", 4, 2, 8)
    inp = uniform_input(schedule, forward_s=1.0)
    heads = forward_heads(schedule, inp.action_s, {})
    assert heads == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0]


def test_schedule_compare_and_file_round_trip(tmp_path, capsys):
    assert main(["schedule", "dualpipe", "--pp", "4", "--vpp", "2", "--microbatches", "8"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# chains: 4 4\n") and len(printed.strip().splitlines()) == 5
    path = tmp_path / "dualpipe.txt"
    path.write_text(printed)
    assert main(["schedule", str(path)]) == 0
    assert "2 pipelines, 8 stages" in capsys.readouterr().out
    sets = ["--set", "parallel.vpp=2", "--set", "parallel.global_batch_size=8"]
    # DualPipe keeps two copies of each stage's weights: this layout may not fit, and then
    # `run` says so with exit code 3 (EXIT_OUT_OF_MEMORY) after printing the step
    code_file = main(["run", str(LLAMA), "--json", "--set", f"parallel.schedule=file:{path}", *sets])
    from_file = json.loads(capsys.readouterr().out)
    code_generated = main(["run", str(LLAMA), "--json", "--set", "parallel.schedule=dualpipe", *sets])
    generated = json.loads(capsys.readouterr().out)
    assert code_file == code_generated == (EXIT_OUT_OF_MEMORY if generated["out_of_memory"] else 0)
    assert from_file["step_time_s"] == generated["step_time_s"]
    assert main(["compare", str(LLAMA), "--schedules", "1f1b,dualpipev,dualpipe"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("1f1b", "dualpipev", "dualpipe"))


def test_planner_leaves_dualpipe_out():
    from mpsim.explore import layouts

    class Context:
        schedules = ()
        max_vpp = 2

    names = {choice["parallel.schedule"] for choice in layouts._schedule(Context(), {"parallel.vpp": 2})}
    assert "dualpipev" in names and "dualpipe" not in names


def test_a_file_of_unequal_pipelines_is_refused(tmp_path, capsys):
    path = tmp_path / "uneven.txt"
    path.write_text("# chains: 3 1\n0F0,3F1,3B1,0B0\n1F0,2F0,2B0,1B0\n")
    assert main(["schedule", str(path)]) == 0  # a valid list of actions
    capsys.readouterr()
    code = main(["run", str(LLAMA), "--set", f"parallel.schedule=file:{path}", "--set", "parallel.pp=2",
                 "--set", "parallel.vpp=2", "--set", "parallel.global_batch_size=4"])
    assert code == 2
    assert "equally long" in capsys.readouterr().err


def test_sweep_fast_path_gives_the_engine_step_time():
    from mpsim.engine.longest_path import simulate_fast, supports

    result = _simulated("dualpipe", "parallel.pp=4", "parallel.dp=2", "parallel.global_batch_size=16",
                        "training.network_contention=false", path=LLAMA_DP)
    assert supports(result.engine_input)
    fast = simulate_fast(result.engine_input)
    assert fast.step_time_s == pytest.approx(result.timeline.step_time_s, rel=1e-9)
    assert fast.rank_end_s == pytest.approx(result.timeline.rank_end_s, rel=1e-9)
