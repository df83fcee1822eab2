"""Write the golden schedule files from torch.distributed.pipelining's own generators.

Run with torch 2.13 installed: ``python tests/golden/make_schedule_goldens.py``. Each
file holds one schedule in the text form (one comma-separated line of actions per
rank), as torch's ``pipeline_order`` lists them with the idle slots dropped.

It needs torch 2.9 or newer: ``ScheduleDualPipeV`` first appears in 2.9, and the
single-stage tables (``_get_pipeline_order`` of GPipe and 1F1B) in 2.8. Actions are
compared by their kind's name, not its value: from torch 2.11 the kinds have string
values ("F", "REDUCE_GRAD"), before that numbers.

torch's 1F1B table (2.9 to 2.13) numbers the last rank's forwards 1..m instead
of 0..m-1 (its warm-up counter starts at 0 and is incremented before the first
steady-state forward, and the last rank has no warm-up); the files store that rank
corrected, and a torch that numbers it from 0 is left as it is.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.pipelining.schedules as torch_schedules

if not hasattr(torch_schedules, "ScheduleDualPipeV"):  # tests/test_schedules_golden.py skips on the same check
    raise SystemExit(f"torch {torch.__version__} has no ScheduleDualPipeV: the goldens need torch 2.9 or newer")

OUT = Path(__file__).resolve().parent / "schedules"

SINGLE = {"gpipe": torch_schedules.ScheduleGPipe, "1f1b": torch_schedules.Schedule1F1B}
MULTI = {"interleaved-1f1b": (torch_schedules.ScheduleInterleaved1F1B, (2, 3)),
         "looped-bfs": (torch_schedules.ScheduleLoopedBFS, (1, 2, 3)),
         "interleaved-zb": (torch_schedules.ScheduleInterleavedZeroBubble, (1, 2, 3)),
         "zbv": (torch_schedules.ScheduleZBVZeroBubble, (2,)),
         "dualpipev": (torch_schedules.ScheduleDualPipeV, (2,))}
GRID = [(p, m) for p in (2, 3, 4, 8) for m in sorted({p, 2 * p, 3 * p, p + 2, 4 * p})]


def _text(order: dict) -> str:
    lines = []
    for rank in sorted(order):
        actions = [a for a in order[rank] if a is not None and a.computation_type.name != "REDUCE_GRAD"]
        lines.append(",".join(str(a) for a in actions))
    return "\n".join(lines) + "\n"


def single(cls, p: int, m: int) -> dict:
    schedule = cls.__new__(cls)
    schedule._num_stages, schedule._n_microbatches = p, m
    order = schedule._get_pipeline_order()
    last = p - 1
    forwards = [a.microbatch_index for a in order[last] if a is not None and a.computation_type.name == "FORWARD"]
    if cls is torch_schedules.Schedule1F1B and min(forwards) == 1:  # the last rank's forwards are numbered from 1
        order[last] = [a if a is None or a.computation_type.name != "FORWARD" else
                       a._replace(microbatch_index=a.microbatch_index - 1) for a in order[last]]
    return order


def multi(cls, p: int, v: int, m: int) -> dict | None:
    schedule = cls.__new__(cls)
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = p, v, m
    schedule._num_stages = schedule.num_stages = p * v
    schedule._stages = [None] * v
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    if m % schedule.number_of_rounds:
        return None  # torch rejects this layout
    if cls is torch_schedules.ScheduleDualPipeV and m < p * v:
        return None
    order = {}
    for rank in range(p):
        schedule.rank = rank
        order[rank] = schedule._calculate_single_rank_operations(rank)
    return order


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, cls in SINGLE.items():
        for p, m in GRID:
            (OUT / f"{name}_p{p}_v1_m{m}.txt").write_text(_text(single(cls, p, m)))
            written += 1
    for name, (cls, vpps) in MULTI.items():
        for v in vpps:
            for p, m in GRID:
                order = multi(cls, p, v, m)
                if order is not None:
                    (OUT / f"{name}_p{p}_v{v}_m{m}.txt").write_text(_text(order))
                    written += 1
    print(f"{written} golden schedules written to {OUT}")


if __name__ == "__main__":
    main()
