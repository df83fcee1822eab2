"""Schedule generators, the text form, and validation."""

from __future__ import annotations

import pytest

from mpsim.schedules import Action, ScheduleError, build_schedule, schedule_from_text, validate
from mpsim.schedules.generators import gpipe, interleaved_1f1b, one_f_one_b

GRID = [(p, m) for p in (1, 2, 3, 4, 5, 8) for m in (1, 2, 3, 4, 8, 9, 16)]


@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("generator", [gpipe, one_f_one_b])
def test_single_stage_generators_are_valid(generator, p, m):
    validate(generator(p, 1, m))


@pytest.mark.parametrize("p,v,m", [(p, v, m) for p in (2, 3, 4, 8) for v in (2, 3, 4)
                                   for m in range(1, 3 * p + 1) if m % max(1, m // p) == 0])
def test_interleaved_is_valid(p, v, m):
    schedule = interleaved_1f1b(p, v, m)
    validate(schedule)
    assert schedule.stage_to_rank == tuple(s % p for s in range(p * v))


def test_1f1b_warmup_and_order():
    schedule = one_f_one_b(4, 1, 6)
    assert [str(a) for a in schedule.actions[0]] == ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4", "0B1", "0F5", "0B2",
                                                     "0B3", "0B4", "0B5"]
    assert [str(a) for a in schedule.actions[3]][:4] == ["3F0", "3B0", "3F1", "3B1"]


def test_text_round_trip():
    schedule = interleaved_1f1b(4, 2, 8)
    again = schedule_from_text(schedule.to_text())
    assert again.actions == schedule.actions
    assert again.stage_to_rank == schedule.stage_to_rank


def test_text_accepts_comments_and_rank_prefix():
    text = "# two ranks\nrank 0: 0F0 0B0\nrank 1: 1F0, 1B0  # last\n"
    schedule = schedule_from_text(text)
    assert schedule.actions == ((Action(0, "F", 0), Action(0, "B", 0)), (Action(1, "F", 0), Action(1, "B", 0)))


def test_deadlock_names_rank_and_action():
    # rank 0 wants the gradient of microbatch 1 before it has sent microbatch 1 forward
    text = "0F0,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n"
    with pytest.raises(ScheduleError, match=r"deadlock: rank 0 can never run 0B1"):
        validate(schedule_from_text(text))


@pytest.mark.parametrize("text,fragment", [
    ("0F0,0B0\n1F0\n", "backward 1B0"),
    ("0F0,0F0,0B0\n1F0,1B0\n", "appears 2 times"),
    ("0F0,0I0\n1F0,1B0\n", "no matching 0W0"),
    ("0F0,0B0,0W0\n1F0,1B0\n", "both B and I/W"),
])
def test_coverage_errors(text, fragment):
    with pytest.raises(ScheduleError, match=fragment):
        validate(schedule_from_text(text))


def test_unparseable_action_names_the_line():
    with pytest.raises(ValueError, match="line 2: '1X0'"):
        schedule_from_text("0F0,0B0\n1X0\n")


def test_file_schedule_must_match_plan(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(one_f_one_b(2, 1, 4).to_text())
    assert build_schedule(f"file:{path}", 2, 1, 4).num_microbatches == 4
    with pytest.raises(ScheduleError, match="the plan has pp=4"):
        build_schedule(f"file:{path}", 4, 1, 4)


def test_aliases_and_unknown():
    assert build_schedule("1F1B-I", 2, 2, 4).name == "interleaved-1f1b"
    with pytest.raises(ScheduleError, match="unknown schedule"):
        build_schedule("zigzag", 2, 1, 4)




def _torch_orders():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    return schedules


@pytest.mark.parametrize("p,v,m", [(p, v, m) for p in (2, 3, 4) for v in (2, 3) for m in (p, 2 * p, 3 * p, p + 1)
                                   if m % max(1, m // p) == 0])
def test_interleaved_matches_torch(p, v, m):
    torch_schedules = _torch_orders()
    sched = torch_schedules.ScheduleInterleaved1F1B.__new__(torch_schedules.ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = p, v, m
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    ours = interleaved_1f1b(p, v, m)
    for rank in range(p):
        theirs = [str(a) for a in sched._calculate_single_rank_operations(rank) if a is not None]
        assert [str(a) for a in ours.actions[rank]] == theirs
