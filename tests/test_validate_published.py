"""The published-runs harness (benchmarks/validate_published.py): its --quick subset as a regression guard."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark

# Mean absolute error (percent) of each table's --quick rows when the guard was set;
# documented in docs/accuracy.md (harness section). A regression guard, not an accuracy
# target: the test fails when a table's error grows more than one point past its value.
QUICK_MEAN_ABS_ERROR_PCT = {
    "korthikanti_table5": 1.96,
    "korthikanti_table4": 3.19,
    "dgxc_v24.11": 2.27,
    "zero_bubble_table4": 9.08,
    "zero_bubble_table9": 5.17,
    "zero_bubble_table6": 11.41,
    "zero_bubble_table7": 10.89,
    "zero_bubble_table10": 6.76,
    "zero_bubble_table11": 7.76,
    "zero_bubble_table12": 11.63,
}
# the same guard for the peak memory of tables whose source prints it (a Zero Bubble Table 4 row
# predicted at 56 % too much before the search counted pending weight gradients: the guard catches that)
QUICK_PEAK_MEMORY_MEAN_ABS_ERROR_PCT = {
    "zero_bubble_table4": 3.58,
    "zero_bubble_table6": 3.70,
    "zero_bubble_table11": 4.44,
    "zero_bubble_table12": 2.97,
}
TOLERANCE_PCT = 1.0


@pytest.fixture(scope="module")
def harness():
    return load_benchmark("validate_published")


@pytest.fixture(scope="module")
def quick_results(harness):
    return harness.run(list(harness.TABLES), quick=True, progress=False)


def test_every_table_has_a_documented_guard(harness):
    assert set(QUICK_MEAN_ABS_ERROR_PCT) == set(harness.TABLES)


def test_quick_rows_all_run(quick_results):
    failed = [(r.table, r.label, r.failure) for r in quick_results if r.failure is not None]
    assert not failed
    for table in QUICK_MEAN_ABS_ERROR_PCT:
        assert sum(r.table == table for r in quick_results) >= 2, table


@pytest.mark.parametrize("table", sorted(QUICK_MEAN_ABS_ERROR_PCT))
def test_quick_error_does_not_grow(harness, quick_results, table):
    stats = harness.statistics([r for r in quick_results if r.table == table])
    limit = QUICK_MEAN_ABS_ERROR_PCT[table] + TOLERANCE_PCT
    assert stats["mean_abs_error_pct"] <= limit, (table, stats)


@pytest.mark.parametrize("table", sorted(QUICK_PEAK_MEMORY_MEAN_ABS_ERROR_PCT))
def test_quick_peak_memory_error_does_not_grow(harness, quick_results, table):
    stats = harness.memory_statistics([r for r in quick_results if r.table == table])
    assert stats is not None and stats["rows"] >= 2
    assert stats["mean_abs_error_pct"] <= QUICK_PEAK_MEMORY_MEAN_ABS_ERROR_PCT[table] + TOLERANCE_PCT, (table, stats)


def test_error_sign_means_slower_than_the_run_in_every_table(harness):
    # a prediction 10 % faster than the run reads -10 % whether the table prints a time (step
    # time: predicted below measured) or a rate (samples per second: predicted above measured),
    # so the last line's mean signed error adds like with like
    common = harness.published_common

    def row(table, measured, predicted):
        case = common.Case(table, "row", measured, lambda: common.Prediction(predicted, {}))
        return harness.run_case(case).error_pct

    assert harness.ALL_TABLES["zero_bubble_table4"].higher_is_faster
    assert not harness.ALL_TABLES["dgxc_v24.11"].higher_is_faster
    assert row("dgxc_v24.11", 10.0, 9.0) == pytest.approx(-10.0)
    assert row("zero_bubble_table4", 10.0, 11.0) == pytest.approx(-10.0)
    assert row("korthikanti_table5", 10.0, 11.0) == pytest.approx(10.0)
    assert row("zero_bubble_table6", 10.0, 9.0) == pytest.approx(10.0)
    # every throughput table is marked, and only those
    rates = {name for name, table in harness.ALL_TABLES.items() if table.higher_is_faster}
    assert rates == {name for name, table in harness.ALL_TABLES.items() if table.quantity == "samples/s per GPU"}
    assert len(rates) == 6


def test_zero_bubble_layer_split_follows_the_fork(harness):
    # --allow-padding-num-layers: first and last chunk one layer fewer (Qi et al. 2024, Table 3)
    assert harness.published_zero_bubble.zero_bubble_split(22, 8, 1) == [2, 3, 3, 3, 3, 3, 3, 2]
    assert harness.published_zero_bubble.zero_bubble_split(62, 32, 1) == [1] + [2] * 30 + [1]
    # one layer per chunk for 1F1B-I: the first and last chunk hold none
    assert harness.published_zero_bubble.zero_bubble_split(22, 8, 3) == [0] + [1] * 22 + [0]


def test_summary_lines(harness, capsys):
    harness.main(["--table", "korthikanti_table4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("tables=1 rows=5 mean_abs_error_pct=")
    assert any(line.startswith("korthikanti_table4: rows=5 ") for line in lines)


def test_zero_bubble_tables_by_size_use_table3_models(harness):
    # Tables 6, 7 and 10-12 print the model by its size only: Table 3's shape of that size
    shapes = harness.published_zero_bubble.setups(harness.DATA)
    assert shapes["6.2B"]["layers"] == 30 and shapes["14.6B"]["hidden"] == 5120
    rows = {case.label: case for case in harness.zero_bubble_table6(harness.DATA)}
    assert len(rows) == 36
    # ZB-V on 16 stages: two one-layer chunks per rank, the padding off the first and last chunk
    assert harness.published_zero_bubble.zero_bubble_split(30, 16, 2) == [0] + [1] * 30 + [0]
    assert rows["6.2B p=16 b=6 m=48 ZB-V"].notes == ()
    assert rows["6.2B p=16 b=3 m=96 ZB-2p*"].notes == ("zb-ilp",)


def test_zero_bubble_table10_tells_the_synchronised_step_apart(harness):
    # both run the same schedule; the post-validated row with training.optimizer_post_validation
    # (tests/test_zero_bubble_post_validation.py), neither with a gap left
    notes = {case.label: case.notes for case in harness.zero_bubble_table10(harness.DATA)}
    assert notes["1.5B p=8 b=6 m=24 ZB-2p all-reduce sync"] == ("zb-ilp",)
    assert notes["1.5B p=8 b=6 m=24 ZB-2p post-validation"] == ("zb-ilp",)
    assert "post-validation" not in harness.GAPS


def test_zero_bubble_table11_leaves_the_ambiguous_rows_out(harness):
    # 36 published rows, 6 with a microbatch count printed as "32 (printed; 64 likely)"
    labels = [case.label for case in harness.zero_bubble_table11(harness.DATA)]
    assert len(labels) == 30 and not any("m=32" in label for label in labels if label.startswith(("14.6B", "28.3B")))
    assert any("left out" in text for _, text in harness.TABLE_GAPS["zero_bubble_table11"])


def test_rows_on_two_processes_give_the_same_results_in_the_same_order(harness, quick_results):
    parallel = harness.run(list(harness.TABLES), quick=True, progress=False, jobs=2)
    assert [(r.table, r.label, r.predicted, r.breakdown, r.extra) for r in parallel] == \
        [(r.table, r.label, r.predicted, r.breakdown, r.extra) for r in quick_results]


def test_a_what_if_reaches_every_row_and_is_undone(harness, quick_results):
    # the dgxc rows with TP > 1 ran with Transformer Engine's TP overlap: without it their steps
    # are longer; Llama 3.1 8B (TP 1) has none to lose. On two processes: the workers get it too
    harness.published_common.WHAT_IF[:] = ["training.tp_comm_overlap=false"]
    try:
        what_if = harness.run(["dgxc_v24.11"], quick=True, progress=False, jobs=2)
    finally:
        harness.published_common.WHAT_IF[:] = []
    published = {r.label: r.predicted for r in quick_results if r.table == "dgxc_v24.11"}
    assert {r.label for r in what_if} == set(published)
    for r in what_if:
        if r.label.startswith("Llama 3.1 8B"):
            assert r.predicted == published[r.label], r.label
        else:
            assert r.predicted > published[r.label] * 1.02, r.label


def test_a_saved_what_if_says_what_it_set(harness, tmp_path, capsys):
    out = tmp_path / "what_if.json"
    harness.main(["--table", "korthikanti_table4", "--set", "parallel.sequence_parallel=false", "--json", str(out)])
    assert capsys.readouterr().out.startswith("what-if: every row with --set parallel.sequence_parallel=false")
    assert json.loads(out.read_text())["what_if"] == ["parallel.sequence_parallel=false"]
    harness.main(["--table", "korthikanti_table4", "--json", str(out)])
    assert json.loads(out.read_text())["what_if"] == []


def test_a_what_if_every_row_refuses_is_one_line(harness, capsys):
    with pytest.raises(SystemExit) as stop:
        harness.main(["--table", "korthikanti_table4", "--set", "training.nonsense=1"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: --set training.nonsense=1: ") and "unknown field" in last
    assert harness.published_common.WHAT_IF == []  # the next run is the published check again


def test_out_of_sample_tables_stay_out_of_the_published_check(harness):
    # the NeMo performance summaries run only when asked for: the published check's tables and
    # last line are those of the shared validation data
    assert harness.table_names(None, False) == list(harness.TABLES)
    assert harness.table_names(None, True) == [*harness.TABLES, *harness.OUT_OF_SAMPLE]
    assert harness.table_names(["nemo_b200_25.02"], False) == ["nemo_b200_25.02"]


def test_out_of_sample_rows_reproduce_the_printed_model_flops(harness):
    # each summary prints model TFLOP/s per GPU beside tokens/s: the row's model shape and the step
    # made of tokens/s give the same rate (a wrong shape, batch or GPU count would not)
    import csv

    from published_common import simulate_step
    from published_dgxc import DGXC_BASE

    printed = {}
    with open(harness.published_nemo.CSV, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["model_tflops_per_gpu"]:
                key = (row["release"], row["system"], row["model"], int(row["num_gpus"]))
                printed[key] = float(row["model_tflops_per_gpu"])
    tables = {"nemo_h100_24.07": ("NeMo 24.07", "DGX-H100"), "nemo_b200_25.02": ("NeMo 25.02", "DGX-B200"),
              "nemo_h100_25.11": ("NeMo 25.11", "DGX-H100"), "nemo_b200_25.11": ("NeMo 25.11", "DGX-B200"),
              "nemo_gb200_25.11": ("NeMo 25.11", "DGX-GB200"), "nemo_h100_26.04.01": ("NeMo 26.04.01", "DGX-H100"),
              "nemo_gb200_26.04.01": ("NeMo 26.04.01", "DGX-GB200")}
    cases = harness.cases_of(list(tables))
    assert len(printed) == len(cases) == 22
    for case in cases:
        model, _, gpus, _ = case.label.split()
        base, overrides = case.predict.args
        assert base == DGXC_BASE
        summary = simulate_step(base, overrides)
        expected = printed[(*tables[case.table], model, int(gpus))]
        if tables[case.table][0] in ("NeMo 25.11", "NeMo 26.04.01"):
            # Megatron-Bridge's count (src/megatron/bridge/training/utils/flop_utils.py) takes the
            # causal half of attention's scores: the FLOPs the kernels run (no recompute here),
            # which also hold the norms' and the rotary embedding's few. 26.04.01's pairs agree
            # less: its revision (21d102f) moved the 70B's TFLOP/s from 735 to 731 and left its
            # tokens/s at 1664: 0.439 TFLOP a token where the same model and sequence
            # in 25.11 print 0.449 (mpsim counts 0.455)
            rate = summary.hardware_flops_per_step / case.measured / int(gpus) / 1e12
            tolerance = 0.04 if tables[case.table][0] == "NeMo 26.04.01" else 0.025
            assert rate == pytest.approx(expected, rel=tolerance), case.label
            continue
        rate = summary.model_flops_per_step / case.measured / int(gpus) / 1e12
        assert rate == pytest.approx(expected, rel=0.015), case.label


def test_out_of_sample_quick_rows_run_on_their_own_system(harness):
    results = harness.run(list(harness.OUT_OF_SAMPLE), quick=True, progress=False)
    assert results and all(r.failure is None for r in results)
    # a B200 row is priced on B200s: the same Llama 3 8B layout is faster there than on H100s
    h100 = harness.run_case(next(c for c in harness.cases_of(["nemo_h100_24.07"]) if c.label.startswith("LLAMA3-8B")))
    b200 = next(r for r in results if r.table == "nemo_b200_25.02" and r.label.startswith("LLAMA3-8B"))
    assert b200.predicted < h100.predicted


def test_moe_rows_reproduce_the_printed_model_flops(harness):
    # Megatron Bridge and the MoE report print model TFLOP/s per GPU beside tokens/s, by Megatron
    # Bridge's count (flop_utils.py: causal half of attention, routed experts at top-k, the logits; no
    # router, norms or recompute): each row's model shape, batch and GPU count give the printed rate.
    # mpsim's count of the FLOPs the kernels run is 1-4 % above it (the diagonal blocks of causal
    # attention, the router and norms; the report's own rows give 147.1-150.1 GFLOP a token)
    import csv

    from published_common import simulate_step
    from published_dgxc import DGXC_BASE
    from published_moe import CSV

    with open(CSV, newline="") as handle:
        rows = list(csv.DictReader(handle))
    cases = harness.cases_of(["megatron_moe"])
    assert len(cases) == len(rows) == 11
    for case, row in zip(cases, rows):
        summary = simulate_step(DGXC_BASE, case.predict.keywords["overrides"])
        rate = summary.hardware_flops_per_step / case.measured / int(row["num_gpus"]) / 1e12
        assert 1.0 <= rate / float(row["model_tflops_per_gpu"]) <= 1.04, case.label
    # the 235B rows run Megatron-Core's combined 1F1B with the experts folded over TP: a layout that
    # needs both (EP 32 on a stage of TP 2 x DP 16)
    assert all("training.overlap_moe_expert_parallel_comm=true" in case.predict.keywords["overrides"]
               for case in cases if "235B" in case.label)


def test_torchtitan_rows_reproduce_the_printed_mfu(harness):
    # the page prints MFU beside tokens/s, from torchtitan's own count (torchtitan/utils.py at
    # 157a12c: 6 x every parameter + 12 x layers x heads x head dim x sequence per token, over
    # A100's 312 TFLOP/s): each row's model shape and tokens/s give the printed MFU, so neither
    # was copied wrong
    import csv

    from mpsim.specs import load_scenario
    from published_torchtitan import CSV, MODELS, TORCHTITAN_BASE

    with open(CSV, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8
    for row in rows:
        model_name, settings = MODELS[row["model"]]
        model = load_scenario(TORCHTITAN_BASE, [f"model={model_name}", *settings]).scenario.model
        h, layers, vocab = model.hidden_size, model.num_layers, model.vocab_size
        kv = model.num_query_groups * model.dim_per_head
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * model.ffn_hidden_size + 2 * h
        params = layers * per_layer + h + 2 * vocab * h  # the final norm, the embedding and the output layer
        per_token = 6 * params + 12 * layers * model.num_attention_heads * model.dim_per_head * int(row["seq_len"])
        mfu = 100 * per_token * float(row["wps_per_gpu"]) / 312e12
        assert mfu == pytest.approx(float(row["mfu_pct"]), abs=0.15), row["model"]
    assert [c.label for c in harness.cases_of(["torchtitan_a100"])] == [
        "Llama 3 8B batch 1 AC selective layer", "Llama 3 8B batch 1 AC selective op", "Llama 3 70B batch 1 AC full",
        "Llama 2 13B batch 2 AC none", "Llama 2 13B batch 2 AC selective layer", "Llama 2 13B batch 2 AC selective op",
        "Llama 2 70B batch 1 AC selective op", "Llama 2 70B batch 2 AC full"]


def test_cudnn_llama_rows_run_on_one_gpu_with_the_kernel_their_backend_names(harness):
    from published_cudnn_llama import BASE, CSV, KERNELS

    from mpsim.results.metrics import summarize
    from mpsim.simulate import simulate
    from mpsim.specs import load_scenario

    cases = harness.cases_of(["cudnn_llama1b"])
    # 6 shapes on each GPU with cuDNN (on the B200 through SDPA) and 6 with FlashAttention-2;
    # the memory-efficient kernel is left out
    assert len(cases) == 24 and len({c.label for c in cases}) == 24
    with open(CSV, newline="") as handle:
        assert sum(1 for _ in handle) - 1 == 36
    # Llama 3.2 1B as transformers builds it: 1,235,814,400 parameters (its tied embedding once)
    result = simulate(load_scenario(BASE).scenario)
    summary = summarize(result)
    assert summary.devices == 1 and summary.dp == 1
    assert summary.memory[0].params == pytest.approx(1_235_814_400, rel=1e-3)
    assert result.scenario.training.attention_kernel is None and set(KERNELS.values()) == {
        ("hgx-h200", "cudnn"), ("hgx-b200", "sdpa-cudnn"), ("hgx-b200", "flash-attention-2"),
        ("hgx-h200", "flash-attention-2")}
    # as measured, cuDNN's kernel makes each GPU's iteration faster than FlashAttention-2's at every shape,
    # and by more at 16,384 tokens than at 768 (attention's share grows with the sequence)
    for gpu, cudnn_id in (("B200", "sdpa-cudnn"), ("H200", "cudnn")):
        runs = {c.label: harness.run_case(c) for c in cases if c.label.startswith(gpu)}
        gains = []
        for label, flash in runs.items():
            if "flash-attention-2" in label:
                cudnn = runs[label.replace("flash-attention-2", cudnn_id)]
                assert cudnn.predicted < flash.predicted and cudnn.measured < flash.measured, label
                gains.append(flash.predicted / cudnn.predicted)
        assert len(gains) == 6 and gains[-1] > gains[0], gpu
