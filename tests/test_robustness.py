"""The bad-input corpus and a fuzzer over the loader and the command line: no traceback, no hang.

The corpus (benchmarks/robustness_corpus.py, 150+ cases across scenario, model, hardware,
Hugging Face config and schedule files, ``--set``, options and output paths) runs here
in-process, each case in its own folder under a time limit; ``benchmarks/robustness.py``
runs the same cases in subprocesses. The fuzzer feeds hypothesis-made scenario texts and
``--set`` values to the command line and fails on any exception that escapes or any exit
code other than 0, 2 (bad input) and 3 (out of memory).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpsim.cli.main import main
from tests.conftest import SCENARIOS, load_benchmark
from tests.conftest import run_in_process as run_cli_in_process

corpus = load_benchmark("robustness_corpus")

CASE_LIMIT_S = 60


def run_in_process(argv: list[str] | tuple[str, ...], cwd) -> tuple[int | None, str]:
    """(exit code, standard error) of ``mpsim ARGV`` run here; None on a hang; an escaping exception fails."""
    run = run_cli_in_process(argv, cwd, CASE_LIMIT_S)
    return run.returncode, run.stderr


CASES = corpus.cases()


def test_the_corpus_has_at_least_150_cases_over_every_kind_of_input():
    assert len(CASES) >= 150
    kinds = {case.argv[0] for case in CASES}
    assert {"run", "schedule", "plan", "compare", "sweep", "hardware", "collective", "import-torch"} <= kinds
    files = {name.rsplit(".", 1)[-1] for case in CASES for name in case.files}
    assert {"yaml", "json", "txt"} <= files


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_bad_input_gets_its_one_line(case, tmp_path):
    corpus.write_files(case, tmp_path)
    code, stderr = run_in_process(case.argv, tmp_path)
    verdict = corpus.judge(case, code, stderr)
    assert verdict == "clean", f"{verdict}: exit {code}, wanted {case.exit} with {list(case.expect)}:\n{stderr}"


SCENARIO_KEYS = ["name", "cluster", "model", "parallel", "training", "nodes", "tp", "pp", "dp", "system",
                 "microbatch_size", "global_batch_size", "schedule", "sweep", "calibration"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**30), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["dgx-a100", "gpt3-175b", "1f1b", ".inf", "80 GiB"]))
trees = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(SCENARIO_KEYS) | st.text(max_size=6), inner,
                                                 max_size=4)), max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
def test_fuzzed_scenario_files_never_escape(tree, tmp_path):
    import yaml

    (tmp_path / "s.yaml").write_text(yaml.safe_dump(tree, allow_unicode=True))
    code, stderr = run_in_process(["run", "s.yaml"], tmp_path)
    assert code in (0, 2, 3), stderr
    if code == 2:
        assert len([line for line in stderr.splitlines() if line.startswith("error:")]) == 1, stderr


BASE_FIELDS = ["parallel.tp", "parallel.pp", "parallel.dp", "parallel.microbatch_size", "parallel.global_batch_size",
               "parallel.schedule", "parallel.vpp", "parallel.recompute", "model.num_layers", "model.hidden_size",
               "model.seq_length", "training.dtype", "training.grad_reduce_bucket_bytes", "cluster.nodes",
               "cluster.system.accelerator.efficiency.gemm", "cluster.system.scale_up.efficiency",
               "cluster.system.collective_channels", "parallel.cp", "model.dropout"]
set_values = st.one_of(st.integers(-3, 10**25).map(str), st.sampled_from(
    ["true", "no", ".nan", "-.inf", "[]", "{}", "''", "1 B", "80 GB/s", "9" * 40, "1f1b", "zbv", "1e308", "0.5"]),
    st.text(max_size=10))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(BASE_FIELDS), value=set_values)
def test_fuzzed_set_values_never_escape(field, value, tmp_path):
    (tmp_path / "s.yaml").write_text(corpus.BASE)
    code, stderr = run_in_process(["run", "s.yaml", "--set", f"{field}={value}"], tmp_path)
    assert code in (0, 2, 3), stderr
    if code == 2:
        assert len([line for line in stderr.splitlines() if line.startswith("error:")]) == 1, stderr


def test_the_dualpipev_trace_is_the_same_on_every_run(tmp_path):
    """Simultaneous events on shared links come out in a defined order, whatever the hash seed."""
    digests = set()
    for seed in ("1", "2"):
        trace = tmp_path / f"t{seed}.json"
        subprocess.run([sys.executable, "-m", "mpsim", "run", str(SCENARIOS / "deepseek_v3_2048xh100.yaml"),
                        "--trace", str(trace), "--trace-full"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        digests.add(hashlib.sha256(trace.read_bytes()).hexdigest())
    assert len(digests) == 1


def test_compare_json_holds_each_schedules_summary_as_run_prints_it(capsys):
    import json

    scenario = str(SCENARIOS / "megatron_22b_8xa100.yaml")
    assert main(["compare", scenario, "--schedules", "1f1b,gpipe", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [entry["schedule"] for entry in body["schedules"]] == ["1f1b", "gpipe"]
    assert main(["run", scenario, "--json", "--set", "parallel.schedule=gpipe"]) == 0
    assert body["schedules"][1]["summary"]["step_time_s"] == json.loads(capsys.readouterr().out)["step_time_s"]


def test_plan_json_lists_the_best_layouts_with_their_metrics(tmp_path, capsys):
    import json

    from tests.conftest import TINY_MODEL

    (tmp_path / "tiny.yaml").write_text(TINY_MODEL)
    assert main(["plan", str(tmp_path / "tiny.yaml"), "--cluster", "dgx-a100", "--devices", "8", "--global-batch",
                 "16", "--max-microbatch", "2", "--schedules", "1f1b", "--workers", "1", "--no-progress", "--top",
                 "3", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert 1 <= len(body["best"]) <= 3 and sum(body["status_counts"].values()) == body["layouts"]
    times = [entry["metrics"]["step_time_s"] for entry in body["best"]]
    assert times == sorted(times)


def test_a_job_that_does_not_fit_exits_3_after_printing_its_step(capsys):
    from mpsim.errors import EXIT_OUT_OF_MEMORY

    scenario = str(SCENARIOS / "llama3_70b_32xh100.yaml")
    code = main(["run", scenario, "--set", "parallel.recompute=none", "--set", "parallel.microbatch_size=8"])
    assert code == EXIT_OUT_OF_MEMORY == 3
    assert "step time" in capsys.readouterr().out
    assert main(["run", scenario]) == 0
