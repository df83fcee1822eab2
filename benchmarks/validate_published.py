"""Predict every published training run in the shared validation data and print the error.

The rows come from the CSV files of ``../shared/validation`` (the shared folder beside the
repository), read at run time: nothing measured is copied into this file. Each row is
written as an mpsim scenario the way its framework ran it (a base scenario file plus
``--set`` overrides, through the public loader), simulated, and summarized. Ten tables:

* ``korthikanti_table5``: Korthikanti et al. 2022, Table 5 (configurations from their
  Table 3): iteration time of GPT 22B-1T on Selene (DGX A100), full recompute and
  sequence parallelism + selective recompute, Megatron-LM of 2022. 8 rows.
* ``korthikanti_table4``: their Table 4, forward and backward time of one 22B layer
  (TP 8, microbatch 4) under five recompute / sequence-parallel settings. One row per
  setting: the row's error is that of forward + backward (the time a step spends in the
  layer, and what the table's overhead column is relative to); the forward and backward
  times, measured and predicted, are printed beside it. The layer is priced with the cost
  model alone, as ``mpsim/balance/auto.py`` prices one layer (a one-layer stage without
  embedding or head), since the measurement is of one layer, not of a step. 5 rows.
* ``dgxc_v24.11``: NVIDIA's DGX Cloud benchmarking recipes, release v24.11.1: Llama 3.1
  8B and 70B and Nemotron-4 15B, BF16 and FP8, 8 to 2048 H100s, NeMo 24.09 / 24.11. Step
  time. 38 rows.
* ``zero_bubble_table4``: Qi et al. 2024 (Zero Bubble Pipeline Parallelism), Table 4:
  samples per second per GPU of 1F1B, interleaved 1F1B, ZB-1p and ZB-2p on A100 for the
  four setups of their Table 3, predicted from first principles (the model, the layout
  and mpsim's own costs and schedules; the paper's profiled pass times are not used).
  48 rows.
* ``zero_bubble_table9``: the same paper's Table 9, the fork's profiled forward (T_F),
  input-gradient (T_B) and weight-gradient (T_W) time of one pipeline stage per
  microbatch, the times its Table 5 bubble rates are computed from. The row's error is
  that of T_F + T_B + T_W; each pass, measured and predicted, is printed beside it. The
  passes are priced with the cost model alone, like Table 4 of Korthikanti. 12 rows.
* ``zero_bubble_table6``, ``_table7``, ``_table10``, ``_table11``, ``_table12``: the same
  paper's other throughput tables, on the same four models: ZB-V against ZB-2p, ZB-1p and
  1F1B on 16 to 32 GPUs (36 rows), a microbatch doubled (18), ZB-2p with and without the
  optimizer's post-validation (8), 1F1B and ZB-1p at ZB-2p's memory (30 of 36; six print
  an ambiguous microbatch count and are left out), fewer microbatches than stages (18).

With ``--out-of-sample`` ten more tables follow, from outside the shared data and not part of
the published check's last line unless asked for: NVIDIA's NeMo performance summaries, NeMo
24.07 on DGX H100 and NeMo 25.02 on DGX B200, FP8, NeMo 25.11 on DGX H100, B200 and GB200 and
NeMo 26.04.01 on DGX H100 and GB200, FP8 with current scaling (``published_nemo.py``, which says
what their framework settings are taken from), torchtitan's FSDP2 runs on 64 A100
(``published_torchtitan.py``), Qwen3 mixtures of experts trained with Megatron-Core on H100
and GB200 (``published_moe.py``) and cuDNN Frontend's Llama 3.2 1B training loop on one H200
and one B200 (``published_cudnn_llama.py``).

The Zero Bubble tables are built in ``published_zero_bubble.py``; what every table shares
(rows, predictions, pricing a step or a stage) is in ``published_common.py``.

Each table compares like with like: step time where the source printed step time,
throughput where it printed throughput. The error is that of the table's own quantity in
percent, signed by the direction in time so that a sign means the same in every table and
in the last line: + the prediction is slower than the run (a longer time, or fewer samples
per second), - faster. A time's error is (predicted - measured) / measured; a throughput's
is (measured - predicted) / measured, the same size with its sign turned. Beside each row
is where the predicted step went, in seconds of the step (ms of the layer for Table 4),
from the Summary (``mpsim/results/metrics.py``, docs/json.md), as
a mean over pipeline ranks: compute (the ranks' actions less the TP/CP/EP collectives and
ZeRO gathers exposed in them), bubble (idle time of fill, drain and stage imbalance:
``bubble_s - bubble_comm_s``), exposed TP, CP, PP (``exposed_pp_comm_s``) and DP
(``exposed_dp_comm_s``) communication, and the optimizer step (``optimizer_s``, with the
distributed optimizer's parameter all-gather where it is not hidden). They add up to about
the step time (the step is the slowest rank's).

Every framework setting is in one commented block per source below, with where it comes
from. Where mpsim cannot express what the framework did, the row uses the nearest
setting, names the gap in its note column, and the gap is listed at the end under
"not expressible yet". Nothing here is fitted to any row.

After each table comes ``<table>: rows=<n> mean_abs_error_pct=.. max_abs_error_pct=..
mean_signed_error_pct=..``; the last line is ``tables=<n> rows=<n> mean_abs_error_pct=<x>
max_abs_error_pct=<y> mean_signed_error_pct=<z>`` over all rows. ``--quick`` runs the
smallest configurations of each source (the 22B rows of Table 5, all of Table 4, the
fewest GPUs of each dgxc model and precision, the 1.5B Zero Bubble setup at 24
microbatches, each Zero Bubble model's Table 9 passes once, the smallest setup's rows of
the other Zero Bubble tables), for CI; ``tests/test_validate_published.py`` guards their errors.

``--set FIELD=VALUE`` asks a what-if of the tables: the field is set in every row after
the row's own settings (``--set training.tp_comm_overlap=false``: the dgxc rows as if
NeMo had not overlapped its tensor-parallel communication). The output says so on its
first line; a what-if that every row refuses the same way is one line and exit code 2.

Usage: python benchmarks/validate_published.py [--table NAME ...] [--quick] [--json FILE]
       [--data DIR] [--jobs N] [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from mpsim.explore.pools import process_context

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_zero_bubble  # noqa: E402,F401 (its tables' shapes, for the tests)
import published_common  # noqa: E402
import published_nemo  # noqa: E402,F401 (its CSV, for the tests)
from published_common import DATA, Case, Result, Table  # noqa: E402
from published_cudnn_llama import (ASSUMPTIONS as CUDNN_LLAMA_ASSUMPTIONS, LEFT_OUT as CUDNN_LLAMA_LEFT_OUT,  # noqa: E402
                                   cudnn_llama_table)
from published_dgxc import dgxc_table  # noqa: E402
from published_korthikanti import korthikanti_table4, korthikanti_table5  # noqa: E402
from published_moe import ASSUMPTIONS as MOE_ASSUMPTIONS, GAPS as MOE_GAPS, megatron_moe_table  # noqa: E402
from published_nemo import ASSUMPTIONS as NEMO_ASSUMPTIONS, ASSUMPTIONS_25_11 as NEMO_25_11_ASSUMPTIONS  # noqa: E402
from published_nemo import ASSUMPTIONS_26_04 as NEMO_26_04_ASSUMPTIONS, nemo_table  # noqa: E402
from published_torchtitan import ASSUMPTIONS as TORCHTITAN_ASSUMPTIONS, torchtitan_table  # noqa: E402
from published_zero_bubble import (ZB_ASSUMPTIONS, ZB_MORE_ASSUMPTIONS, ZB_T9_ASSUMPTIONS,  # noqa: E402
                                   ZB_T11_LEFT_OUT, zero_bubble_table4, zero_bubble_table6,
                                   zero_bubble_table7, zero_bubble_table9, zero_bubble_table10, zero_bubble_table11,
                                   zero_bubble_table12)


# --- gaps: what the frameworks did that mpsim cannot express yet --------------------------------------------------
# key -> description. Rows name the keys that apply to them in their note column.
GAPS: dict[str, str] = {
    "zb-ilp": "the paper's ZB-1p / ZB-2p refine the heuristic schedule with an ILP; mpsim's zb-1p / zb-2p run "
              "the heuristic as a search without it (docs/schedules.md); nearest: that",
    **MOE_GAPS,
}

# gaps of a whole table or of a kind of its rows, not marked row by row: table -> (which rows, gap)
# the cluster of every Zero Bubble throughput table
ZB_CLUSTER_GAP = ("all rows", ("the cluster is 'up to 4 nodes x 8 A100 SXM 80GB, RoCE RDMA' with no NIC bandwidth "
                               "printed; nearest: the shipped dgx-a100 system (8x HDR 200 Gb/s InfiniBand per node)"))
TABLE_GAPS: dict[str, list[tuple[str, str]]] = {
    "zero_bubble_table4": [ZB_CLUSTER_GAP],
    "zero_bubble_table6": [ZB_CLUSTER_GAP],
    "zero_bubble_table7": [ZB_CLUSTER_GAP],
    "zero_bubble_table10": [ZB_CLUSTER_GAP],
    "zero_bubble_table11": [ZB_CLUSTER_GAP, ZB_T11_LEFT_OUT],
    "zero_bubble_table12": [ZB_CLUSTER_GAP],
    "cudnn_llama1b": [CUDNN_LLAMA_LEFT_OUT],
}

BREAKDOWN = ("compute", "bubble", "tp", "cp", "pp", "dp", "optimizer")
# what a table's breakdown splits, where it is not a step
PREDICTED_UNIT = {"korthikanti_table4": "layer", "zero_bubble_table9": "stage's passes"}


def zb_throughput_table(number: int, what: str, build, memory: bool, by_size: bool = False) -> Table:
    """A Zero Bubble table of samples/s per GPU: the step beside each row, and the peak memory where
    the paper printed it; ``by_size``: the table names its models by their size only."""
    columns = (("step s", "step_s"),) + ((("GB meas", "mem_meas"), ("GB pred", "mem_pred")) if memory else ())
    return Table(f"Qi et al. 2024 (Zero Bubble), Table {number}: {what}, the authors' Megatron-LM fork on A100",
                 "samples/s per GPU", "samples/s/GPU", "s", build, columns,
                 ZB_ASSUMPTIONS + (ZB_MORE_ASSUMPTIONS if by_size else ()), higher_is_faster=True)


TABLES: dict[str, Table] = {
    "korthikanti_table5": Table("Korthikanti et al. 2022, Table 5: iteration time, Megatron-LM (2022) on DGX A100",
                                "step time", "s", "s", korthikanti_table5),
    "korthikanti_table4": Table("Korthikanti et al. 2022, Table 4: one 22B layer, forward + backward, TP 8, "
                                "microbatch 4, A100", "layer forward + backward", "ms", "ms", korthikanti_table4,
                                (("fwd meas", "fwd_meas"), ("fwd pred", "fwd_pred"), ("bwd meas", "bwd_meas"),
                                 ("bwd pred", "bwd_pred"))),
    "dgxc_v24.11": Table("NVIDIA DGX Cloud benchmarking recipes v24.11.1: step time, NeMo 24.09/24.11 on DGX H100",
                         "step time", "s", "s", dgxc_table),
    "zero_bubble_table4": zb_throughput_table(4, "throughput", zero_bubble_table4, memory=True),
    "zero_bubble_table9": Table("Qi et al. 2024 (Zero Bubble), Table 9: profiled F, B and W passes of one "
                                "pipeline stage per microbatch, the authors' fork on A100", "T_F + T_B + T_W",
                                "ms", "ms", zero_bubble_table9,
                                (("F meas", "f_meas"), ("F pred", "f_pred"), ("B meas", "b_meas"),
                                 ("B pred", "b_pred"), ("W meas", "w_meas"), ("W pred", "w_pred")),
                                ZB_ASSUMPTIONS[1:] + ZB_T9_ASSUMPTIONS),
    "zero_bubble_table6": zb_throughput_table(6, "ZB-V against ZB-2p (half the microbatch, twice the count), ZB-1p "
                                                 "and 1F1B", zero_bubble_table6, memory=True, by_size=True),
    "zero_bubble_table7": zb_throughput_table(7, "ZB-V, ZB-1p and 1F1B at a microbatch and at twice it",
                                              zero_bubble_table7, memory=False, by_size=True),
    "zero_bubble_table10": zb_throughput_table(10, "ZB-2p with the optimizer's post-validation and with its "
                                                   "synchronised step", zero_bubble_table10, memory=False, by_size=True),
    "zero_bubble_table11": zb_throughput_table(11, "1F1B and ZB-1p at twice ZB-2p's microbatch (the same memory)",
                                               zero_bubble_table11, memory=True, by_size=True),
    "zero_bubble_table12": zb_throughput_table(12, "fewer microbatches than stages, 1F1B and ZB-2p",
                                               zero_bubble_table12, memory=True, by_size=True),
}

# Not in the shared validation data, and run only with --out-of-sample: NVIDIA's NeMo performance
# summaries (published_nemo.py), whose framework settings are those of the nearest published
# recipes, torchtitan's runs and cuDNN Frontend's one-GPU training loop; their rows stay out of
# the published check's last line unless asked for
def _nemo(release: str, system: str, precision: str, assumptions) -> tuple[str, Table]:
    """(name, table) of one NeMo summary's rows of one release on one system (published_nemo.py)."""
    name = f"nemo_{system.split('-')[1].lower()}_{release.split()[1]}"
    title = f"NeMo performance summary, {release} on {system.replace('-', ' ')}, {precision} (out of sample)"
    return name, Table(title, "step time", "s", "s", nemo_table(name, release, system), assumptions=assumptions)


OUT_OF_SAMPLE: dict[str, Table] = {
    **dict([_nemo("NeMo 24.07", "DGX-H100", "FP8", NEMO_ASSUMPTIONS),
            _nemo("NeMo 25.02", "DGX-B200", "FP8", NEMO_ASSUMPTIONS)]),
    # Megatron-Bridge's summaries of NeMo 25.11 and 26.04.01 (26.04.01: larger batches): their
    # data-parallel Llama rows (their FSDP rows left out)
    **dict(_nemo("NeMo 25.11", system, "FP8 current scaling", NEMO_25_11_ASSUMPTIONS)
           for system in ("DGX-H100", "DGX-B200", "DGX-GB200")),
    **dict(_nemo("NeMo 26.04.01", system, "FP8 current scaling", NEMO_26_04_ASSUMPTIONS)
           for system in ("DGX-H100", "DGX-GB200")),
    "torchtitan_a100": Table("torchtitan performance page (April 2024): FSDP2 on 64 A100, eager PyTorch "
                             "(out of sample)", "step time", "s", "s", torchtitan_table,
                             assumptions=TORCHTITAN_ASSUMPTIONS),
    "megatron_moe": Table("Qwen3 mixtures of experts under Megatron-Core: Megatron Bridge's performance summaries "
                          "(NeMo 25.11-26.06, DGX H100) and the Megatron-Core MoE report (H100, GB200) (out of sample)",
                          "step time", "s", "s", megatron_moe_table, (("EP exp", "ep"),), MOE_ASSUMPTIONS),
    "cudnn_llama1b": Table("cuDNN Frontend's Llama 3.2 1B training loop (October 2025): one H200 or B200, eager "
                           "Hugging Face transformers (out of sample)", "iteration time", "s", "s", cudnn_llama_table,
                           assumptions=CUDNN_LLAMA_ASSUMPTIONS),
}
ALL_TABLES: dict[str, Table] = {**TABLES, **OUT_OF_SAMPLE}


# --- running and printing -----------------------------------------------------------------------------------------

def run_case(case: Case) -> Result:
    try:
        prediction = case.predict()
    except Exception as exc:  # noqa: BLE001 - a row mpsim cannot run is reported, not fatal
        return Result(case.table, case.label, case.measured, None, None, {}, {}, case.notes,
                      f"{type(exc).__name__}: {exc}")
    error = 100 * (prediction.value - case.measured) / case.measured
    if ALL_TABLES[case.table].higher_is_faster:
        error = -error  # more samples per second is faster: + stays "slower than the run" in every table
    return Result(case.table, case.label, case.measured, prediction.value, error, prediction.breakdown,
                  prediction.extra, case.notes)


def cases_of(tables: list[str], quick: bool = False, data: Path = DATA) -> list[Case]:
    """The rows of ``tables`` in their order (the --quick subset with ``quick``)."""
    return [case for name in tables for case in ALL_TABLES[name].build(data) if case.quick or not quick]


# the rows a worker process runs, built once per worker (their predict functions are closures,
# which do not travel between processes; the worker builds the same list and runs rows by index)
_WORKER_CASES: list[Case] = []


def _start_worker(tables: list[str], quick: bool, data: Path, what_if: list[str]) -> None:
    published_common.WHAT_IF[:] = what_if
    _WORKER_CASES[:] = cases_of(tables, quick, data)


def _timed(case: Case) -> tuple[Result, float]:
    start = time.perf_counter()
    return run_case(case), time.perf_counter() - start


def _run_index(index: int) -> tuple[Result, float]:
    return _timed(_WORKER_CASES[index])


def run(tables: list[str], quick: bool = False, data: Path = DATA, progress: bool = True,
        jobs: int = 1) -> list[Result]:
    """Predict the rows of ``tables`` (the --quick subset with ``quick``), on ``jobs`` processes.

    The rows are independent and deterministic, so the results are the same, in the same
    order, however many processes run them. The workers fork, or start afresh (spawn) where
    this process has loaded a runtime whose threads make a fork unsafe
    (``mpsim.explore.pools.process_context`` says why); either way each builds the rows
    itself and runs them by index.
    """
    cases = cases_of(tables, quick, data)
    pool = None
    if jobs > 1 and len(cases) > 1:
        pool = process_context("spawn").Pool(min(jobs, len(cases)), initializer=_start_worker,
                                             initargs=(tables, quick, data, list(published_common.WHAT_IF)))
    try:
        timed = pool.imap(_run_index, range(len(cases))) if pool is not None else map(_timed, cases)
        results = []
        for index, (result, seconds) in enumerate(timed, 1):
            results.append(result)
            if progress:
                print(f"[{index}/{len(cases)}] {result.table}: {result.label} ({seconds:.1f} s)",
                      file=sys.stderr, flush=True)
        return results
    finally:
        if pool is not None:
            pool.terminate()


def error_statistics(errors: list[float]) -> dict[str, float]:
    """rows, mean and max absolute error and mean signed error (percent)."""
    if not errors:
        return {"rows": 0, "mean_abs_error_pct": float("nan"), "max_abs_error_pct": float("nan"),
                "mean_signed_error_pct": float("nan")}
    return {"rows": len(errors), "mean_abs_error_pct": sum(abs(e) for e in errors) / len(errors),
            "max_abs_error_pct": max(abs(e) for e in errors),
            "mean_signed_error_pct": sum(errors) / len(errors)}


def statistics(results: list[Result]) -> dict[str, float]:
    """The error statistics of the predicted rows."""
    return error_statistics([r.error_pct for r in results if r.error_pct is not None])


def memory_statistics(results: list[Result]) -> dict[str, float] | None:
    """Error statistics of the peak memory, for rows whose source prints it (``mem_meas`` / ``mem_pred``)."""
    pairs = [(r.extra["mem_meas"], r.extra["mem_pred"]) for r in results
             if r.failure is None and "mem_meas" in r.extra and "mem_pred" in r.extra]
    if not pairs:
        return None
    return error_statistics([100.0 * (predicted / measured - 1.0) for measured, predicted in pairs])


def _stats_text(stats: dict[str, float]) -> str:
    return (f"rows={stats['rows']} mean_abs_error_pct={stats['mean_abs_error_pct']:.2f} "
            f"max_abs_error_pct={stats['max_abs_error_pct']:.2f} "
            f"mean_signed_error_pct={stats['mean_signed_error_pct']:.2f}")


def _fmt(value: float | None, width: int) -> str:
    if value is None:
        return f"{'-':>{width}s}"
    digits = 3 if abs(value) < 100 else 1
    return f"{value:{width}.{digits}f}"


def print_table(name: str, results: list[Result]) -> None:
    table = ALL_TABLES[name]
    print(f"== {name}: {table.title}")
    print(f"   measured / predicted: {table.quantity} ({table.unit}); breakdown in {table.breakdown_unit} of the "
          f"predicted {PREDICTED_UNIT.get(name, 'step')}")
    formula = "(measured - predicted)" if table.higher_is_faster else "(predicted - measured)"
    print(f"   error: {formula} / measured; + the prediction is slower than the run, - faster")
    for assumption in table.assumptions:
        print(f"   assumed: {assumption}")
    width = max([len(r.label) for r in results] + [13])
    extra = table.extra_columns
    header = (f"{'configuration':{width}s} {'measured':>9s} {'predicted':>9s} {'error':>7s} "
              + " ".join(f"{h:>8s}" for h in ("compute", "bubble", "TP", "CP", "PP", "DP", "optim"))
              + "".join(f" {h:>8s}" for h, _ in extra) + "  note")
    print(header)
    for r in results:
        if r.failure is not None:
            print(f"{r.label:{width}s} {_fmt(r.measured, 9)} {'failed':>9s}  {r.failure}")
            continue
        cells = " ".join(_fmt(r.breakdown.get(key), 8) for key in BREAKDOWN)
        more = "".join(f" {_fmt(r.extra.get(key), 8)}" for _, key in extra)
        note = ",".join(r.notes)
        print(f"{r.label:{width}s} {_fmt(r.measured, 9)} {_fmt(r.predicted, 9)} {r.error_pct:+6.1f}% {cells}{more}"
              f"  {note}".rstrip())
    print(f"{name}: {_stats_text(statistics(results))}")
    memory = memory_statistics(results)
    if memory is not None:
        print(f"{name} peak memory (GB measured against mpsim's peak_memory_bytes; not in the line above or the "
              f"last line): {_stats_text(memory)}")
    print()


def print_gaps(names: list[str], results: list[Result]) -> None:
    print("not expressible yet (the rows use the nearest setting; the note column names the gap):")
    used = sorted({note for r in results for note in r.notes if note in GAPS}, key=list(GAPS).index)
    for key in used:
        counts = ", ".join(f"{name}: {sum(key in r.notes for r in results if r.table == name)} rows"
                           for name in names if any(key in r.notes for r in results if r.table == name))
        print(f"  {key} ({counts}): {GAPS[key]}")
    for name in names:
        for scope, text in TABLE_GAPS.get(name, []):
            print(f"  {name}, {scope}: {text}")
    if not used and not any(TABLE_GAPS.get(name) for name in names):
        print("  none")
    failed = [r for r in results if r.failure is not None]
    if failed:
        print(f"rows mpsim could not run ({len(failed)}; left out of the statistics):")
        for r in failed:
            print(f"  {r.table}: {r.label}: {r.failure}")


def report(names: list[str], results: list[Result]) -> dict:
    """Print the tables, the gaps and the summary lines; return the same as a JSON-ready dict."""
    per_table = {}
    for name in names:
        rows = [r for r in results if r.table == name]
        if rows:
            print_table(name, rows)
            per_table[name] = statistics(rows)
            memory = memory_statistics(rows)
            if memory is not None:
                per_table[name]["peak_memory"] = memory
    print_gaps(names, results)
    overall = statistics(results)
    print(f"tables={len(per_table)} rows={overall['rows']} mean_abs_error_pct={overall['mean_abs_error_pct']:.2f} "
          f"max_abs_error_pct={overall['max_abs_error_pct']:.2f} "
          f"mean_signed_error_pct={overall['mean_signed_error_pct']:.2f}")
    return {"tables": per_table, "overall": overall, "rows": [asdict(r) for r in results],
            "gaps": {key: GAPS[key] for key in GAPS if any(key in r.notes for r in results)},
            "table_gaps": {name: TABLE_GAPS.get(name, []) for name in per_table}}


def table_names(chosen: list[str] | None, out_of_sample: bool) -> list[str]:
    """The tables to run: those named (``--table``), else the published check's, and with
    ``--out-of-sample`` the tables from outside the shared data after them."""
    if chosen is not None:
        return [name for name in ALL_TABLES if name in chosen]
    return [*TABLES, *(OUT_OF_SAMPLE if out_of_sample else ())]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="append", choices=list(ALL_TABLES), metavar="NAME",
                        help=f"run only this table (repeatable): {', '.join(ALL_TABLES)}")
    parser.add_argument("--out-of-sample", action="store_true",
                        help=f"add the tables from outside the shared data ({', '.join(OUT_OF_SAMPLE)}; "
                             "benchmarks/published_nemo.py, published_torchtitan.py, published_moe.py, "
                             "published_cudnn_llama.py); "
                             "not the published check")
    parser.add_argument("--quick", action="store_true", help="a few rows per table (for CI)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows and statistics as JSON")
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the published CSV files")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run the rows on N processes (default 1; the results do not depend on it)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a what-if: set a scenario field in every row after the row's own settings "
                             "(repeatable), e.g. --set training.tp_comm_overlap=false; not the published check")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} is not a number of processes (1 or more)")
    for item in args.set:
        if "=" not in item or not item.split("=", 1)[0].strip():
            parser.error(f"--set {item}: expected FIELD=VALUE")
    names = table_names(args.table, args.out_of_sample)
    start = time.perf_counter()
    published_common.WHAT_IF[:] = args.set
    try:
        results = run(names, quick=args.quick, data=args.data, jobs=args.jobs)
    finally:
        published_common.WHAT_IF[:] = []
    failures = {r.failure for r in results}
    if args.set and results and len(failures) == 1 and None not in failures:
        # the what-if broke every row the same way: it is the what-if that is wrong
        print(f"error: --set {' '.join(args.set)}: {failures.pop()}", file=sys.stderr)
        sys.exit(2)
    if args.set:
        print(f"what-if: every row with --set {' --set '.join(args.set)} (not the published check)\n")
    out = report(names, results)
    out["what_if"] = list(args.set)  # empty for the published check; a saved what-if says what it set
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
