"""Reproduce the bubble rates of Zero Bubble Pipeline Parallelism (Qi et al. 2024), Tables 5 and 8.

For every setup with profiled per-stage times (Table 9: T_F, T_B, T_W and T_comm, the
time of one pipeline transfer), the engine runs 1F1B, interleaved 1F1B (one layer per
chunk, as the paper does), ZB-H1, ZB-H2 and ZB-V with those times and reports the
paper's bubble rate: (cost - m (T_F + T_B + T_W)) / cost with cost the longest stage
span. Table 8 setups without their own profiled times are skipped and counted.

The paper's ZB-1p and ZB-2p rows come from its automatic search; mpsim's search
(``mpsim/schedules/zb_search.py``, ranked by the paper's cost) gets the same profiled
times and pending-backward limits (p and 2p), and the script prints how its bubble rates
compare: the goal is to be at least as good. The last line is
``max_abs_error_pp=<x> rows=<n>`` over the other five schedules.

It then holds the paper's own cost against the paper's own measurements: for every
Table 4 throughput row, the step the run took (microbatches x microbatch size / GPUs /
samples per second per GPU) against the cost the paper's Table 5 bubble rate implies
(m (T_F + T_B + T_W) / (1 - bubble rate), the profiled passes and transfers of Table 9),
as milliseconds per microbatch the run spent beyond that cost, per schedule, and the same
per pass that waits for a receive (a middle stage's forwards and input-gradient backwards,
once per chunk) beside the paper's T_comm. Nothing here is mpsim's: it says how much of
each run no schedule model built on the passes' profiled times can hold, and how it grows
with the pass boundaries a schedule has.

Usage: python benchmarks/zero_bubble_tables.py
"""

from __future__ import annotations

import csv
from pathlib import Path

from mpsim.engine import EngineInput, rank_spans, simulate
from mpsim.schedules import Schedule, build_schedule
from mpsim.schedules.zb_search import StageTimes, zb_1p, zb_2p

DATA = Path(__file__).resolve().parent / "data"
# paper name -> (mpsim schedule, chunks per rank; None = one transformer layer per chunk)
SCHEDULES = {"1F1B": ("1f1b", 1), "1F1B-I": ("interleaved-1f1b", None), "ZB-H1": ("zb-h1", 1),
             "ZB-H2": ("zb-h2", 1), "ZB-V": ("zbv", 2)}
SEARCHES = {"ZB-1p": zb_1p, "ZB-2p": zb_2p}


def profiled_times() -> dict[tuple[str, int, int], tuple[float, float, float, float, int]]:
    """(model, pp, microbatches) -> (T_F, T_B, T_W, T_comm, layers) from Table 9."""
    times = {}
    for row in csv.DictReader((DATA / "zero_bubble_main_tables3_4_5_9.csv").open()):
        key = (row["model"], int(row["pp"]), int(row["num_microbatches"]))
        times[key] = (float(row["TF"]), float(row["TB"]), float(row["TW"]), float(row["Tcomm"]), int(row["layers"]))
    return times


def bubble_rate(schedule: Schedule, v: int, tf: float, tb: float, tw: float, tcomm: float) -> float:
    """The paper's bubble rate of one schedule with uniform per-chunk times (a stage split into v chunks)."""
    action_s, transfer_s = {}, {}
    for stage in range(schedule.num_stages):
        action_s.update({(stage, "F"): tf / v, (stage, "B"): (tb + tw) / v, (stage, "I"): tb / v,
                         (stage, "W"): tw / v})
    for stage in range(schedule.num_stages - 1):
        transfer_s[(stage, stage + 1)] = transfer_s[(stage + 1, stage)] = tcomm
    timeline = simulate(EngineInput(schedule, action_s, transfer_s))
    span, busy = max((r[-1].end_s - r[0].start_s, sum(x.end_s - x.start_s for x in r)) for r in timeline.actions)
    return (span - busy) / span


def searched_rate(name: str, p: int, m: int, tf: float, tb: float, tw: float, tcomm: float) -> float:
    """The bubble rate of mpsim's search for the paper's ZB-1p or ZB-2p setup."""
    schedule = SEARCHES[name](StageTimes.uniform(p, tf, tb, tw, tcomm), m, rank_spans, objective="span")
    return bubble_rate(schedule, 1, tf, tb, tw, tcomm)


def compare_searched() -> list[tuple[str, tuple, str, float, float]]:
    """(table, setup, schedule, paper, mpsim) rows of the paper's ZB-1p and ZB-2p setups."""
    times = profiled_times()
    rows = []
    for row in csv.DictReader((DATA / "zero_bubble_bubble_rates_tables5_8.csv").open()):
        key = (row["model"], int(row["pp"]), int(row["num_microbatches"]))
        if row["schedule"] in SEARCHES and key in times:
            tf, tb, tw, tcomm, _ = times[key]
            rows.append((row["table_ref"], key, row["schedule"], float(row["bubble_rate"]),
                         searched_rate(row["schedule"], key[1], key[2], tf, tb, tw, tcomm)))
    return rows


def interleaved_chunks(layers: int, pp: int) -> int:
    """Chunks per rank of the paper's 1F1B-I, one transformer layer each: the first and last
    stage hold one layer fewer (Table 3 note), so the layers and those two make whole stages."""
    return (layers + 2) // pp


def compare() -> tuple[list[tuple[str, tuple, str, float, float]], int]:
    """(table, setup, schedule, paper, mpsim) rows of the five fixed schedules, and how many
    rows had no profiled times."""
    times = profiled_times()
    rows, skipped = [], 0
    for row in csv.DictReader((DATA / "zero_bubble_bubble_rates_tables5_8.csv").open()):
        key = (row["model"], int(row["pp"]), int(row["num_microbatches"]))
        if row["schedule"] not in SCHEDULES:
            continue  # ZB-1p / ZB-2p: compare_searched
        if key not in times:
            skipped += 1
            continue
        tf, tb, tw, tcomm, layers = times[key]
        name, v = SCHEDULES[row["schedule"]]
        p, m = key[1], key[2]
        if v is None:
            v = interleaved_chunks(layers, p)
        rows.append((row["table_ref"], key, row["schedule"], float(row["bubble_rate"]),
                     bubble_rate(build_schedule(name, p, v, m, check=True), v, tf, tb, tw, tcomm)))
    return rows, skipped


def beyond_paper_cost() -> list[tuple[str, int, str, float, float]]:
    """(model, microbatches, schedule, measured step s, ms per microbatch beyond the paper's cost)
    for every Table 4 row."""
    rows = []
    for row in csv.DictReader((DATA / "zero_bubble_main_tables3_4_5_9.csv").open()):
        m, gpus = int(row["num_microbatches"]), int(row["num_gpus"])
        step_s = m * int(row["microbatch"]) * int(row["dp"]) / gpus / float(row["samples_per_s_per_gpu"])
        work_s = m * (float(row["TF"]) + float(row["TB"]) + float(row["TW"])) / 1e3  # the passes are in ms
        cost_s = work_s / (1.0 - float(row["bubble_rate_table5"]))
        rows.append((row["model"], m, row["schedule"], step_s, (step_s - cost_s) / m * 1e3))
    return rows


def receiving_passes(schedule: str, layers: int, pp: int) -> int:
    """Passes per microbatch of a middle stage that wait for a receive: every forward and every
    input-gradient backward (a weight-gradient pass receives nothing), once per chunk."""
    return 2 * (interleaved_chunks(layers, pp) if schedule == "1F1B-I" else 1)


def per_receiving_pass() -> list[tuple[str, int, str, float, float]]:
    """(model, microbatches, schedule, ms beyond the paper's cost per receiving pass, the paper's
    T_comm in ms) for every Table 4 row: were the excess a transfer that each receiving pass
    waits for in full after the pass before it ends (a receive posted only then), it would be
    about T_comm per receiving pass."""
    rows = []
    data = csv.DictReader((DATA / "zero_bubble_main_tables3_4_5_9.csv").open())
    for row, (model, m, schedule, _, extra_ms) in zip(data, beyond_paper_cost(), strict=True):
        passes = receiving_passes(schedule, int(row["layers"]), int(row["pp"]))
        rows.append((model, m, schedule, extra_ms / passes, float(row["Tcomm"])))
    return rows


def print_spans(rows: list[tuple[str, str, float, float | None]], digits: int) -> None:
    """One line per schedule: each model's range of a value over its microbatch counts, and of
    the paper's T_comm beside it where a row carries one."""
    for schedule in dict.fromkeys(name for _, name, _, _ in rows):
        spans: dict[str, list[tuple[float, float | None]]] = {}
        for model, name, value, tcomm in rows:
            if name == schedule:
                spans.setdefault(model, []).append((value, tcomm))
        parts = []
        for model, pairs in spans.items():
            values = [value for value, _ in pairs]
            text = f"{model} {min(values):.{digits}f}-{max(values):.{digits}f}"
            times = [tcomm for _, tcomm in pairs if tcomm is not None]
            if times:
                text += f" (T_comm {min(times):.2f}-{max(times):.2f})"
            parts.append(text)
        print(f"  {schedule:7s} " + "  ".join(parts))


def main() -> None:
    rows, skipped = compare()
    searched = compare_searched()
    print(f"{'table':8s} {'model':6s} {'p':>3s} {'m':>4s} {'schedule':8s} {'paper':>7s} {'mpsim':>7s} "
          f"{'error (pp)':>10s}")
    for table, (model, p, m), schedule, paper, ours in rows + searched:
        print(f"{table[:8]:8s} {model:6s} {p:3d} {m:4d} {schedule:8s} {paper:7.4f} {ours:7.4f} "
              f"{100 * (ours - paper):+10.2f}")
    as_good = sum(ours <= paper + 5e-5 for *_, paper, ours in searched)  # the paper prints 4 decimals
    worst = max(100 * (ours - paper) for *_, paper, ours in searched)
    print(f"searched ZB-1p / ZB-2p: as good as the paper's search in {as_good} of {len(searched)} rows; "
          f"largest excess {worst:+.2f} pp")
    print(f"skipped {skipped} rows without profiled times (Table 8 setups of 6.2B at p=16 and 14.6B at p=24)")
    print("measured steps (Table 4) beyond the paper's own cost (Table 5 bubble rate, Table 9 passes), "
          "ms per microbatch, per model over its microbatch counts:")
    print_spans([(model, name, extra, None) for model, _, name, _, extra in beyond_paper_cost()], 1)
    print("the same per pass that waits for a receive (forwards and input-gradient backwards of a middle "
          "stage), against the paper's T_comm, ms:")
    print_spans([(model, name, extra, tcomm) for model, _, name, extra, tcomm in per_receiving_pass()], 2)
    worst = max(abs(100 * (ours - paper)) for *_, paper, ours in rows)
    print(f"max_abs_error_pp={worst:.2f} rows={len(rows)}")


if __name__ == "__main__":
    main()
