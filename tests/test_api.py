"""The Python interface (mpsim/api/) gives what the command line gives, and says what is wrong in one line.

docs/api.md runs here as a doctest; the rest hold the interface to the commands it
wraps: the same scenario by name and by path, the same overrides as ``--set``, the same
summary as ``mpsim run --json`` and the same schedules and chunks as ``mpsim compare``.
"""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mpsim
from mpsim.cli.main import build_parser, main
from mpsim.errors import InputError
from mpsim.specs import load_scenario
from mpsim.units import format_seconds

ROOT = Path(__file__).resolve().parent.parent
NAME = "llama3-70b-32xh100"  # TP 8, PP 4, 1F1B: a real pipeline bubble, simulated in a fraction of a second
FILE = ROOT / "scenarios" / "llama3_70b_32xh100.yaml"
SMALL = "megatron-22b-8xa100"  # one rank, one microbatch: the cheapest pictures to draw


@pytest.fixture(scope="module")
def result():
    return mpsim.simulate(NAME)


def test_the_documentation_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    monkeypatch.chdir(tmp_path)  # the page writes and names files in the working folder
    outcome = doctest.testfile(str(ROOT / "docs" / "api.md"), module_relative=False, verbose=False,
                               optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert outcome.failed == 0
    assert outcome.attempted >= 30


def test_import_mpsim_loads_nothing_else():
    code = "import mpsim, sys; print(sorted(m for m in sys.modules if m.startswith('mpsim')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['mpsim']"


def test_mpsim_simulate_stays_the_function_after_its_module_is_imported():
    import mpsim.simulate  # noqa: F401  (the import system sets the package attribute to the module)
    from mpsim.api import simulate
    from mpsim.simulate import bubble_reference

    assert mpsim.simulate is simulate
    assert sys.modules["mpsim.simulate"].bubble_reference is bubble_reference


def test_load_by_name_and_by_path_give_the_same_scenario():
    by_name = mpsim.load(NAME)
    assert by_name == mpsim.load(FILE) == mpsim.load(str(FILE))
    assert by_name == load_scenario(str(FILE)).scenario


def test_overrides_as_dict_and_as_list_agree_with_the_command_lines_set():
    values = {"parallel.microbatch_size": 2, "cluster.system": "dgx-a100",
              "cluster.system.scale_out.nic_bandwidth": "400 Gb/s", "parallel.sequence_parallel": False}
    texts = ["parallel.microbatch_size=2", "cluster.system=dgx-a100",
             "cluster.system.scale_out.nic_bandwidth=400 Gb/s", "parallel.sequence_parallel=false"]
    argv = ["run", NAME] + [part for text in texts for part in ("--set", text)]
    cli_overrides = build_parser().parse_args(argv).overrides
    from_cli = load_scenario(NAME, cli_overrides).scenario
    as_dict = mpsim.load(NAME, values)
    assert as_dict == mpsim.load(NAME, texts) == from_cli
    assert as_dict != mpsim.load(NAME)  # the overrides changed something
    assert as_dict.cluster.system.name == "dgx-a100" and as_dict.parallel.microbatch_size == 2


def test_overrides_on_a_loaded_scenario_add_to_its_own():
    base = mpsim.load(NAME, {"parallel.microbatch_size": 2})
    both = mpsim.load(base, {"parallel.schedule": "gpipe"})
    assert both == mpsim.load(NAME, ["parallel.microbatch_size=2", "parallel.schedule=gpipe"])


def test_simulate_gives_the_summary_of_mpsim_run_json(capsys):
    overrides = ["parallel.global_batch_size=32"]  # 32 microbatches of 1, still within memory
    assert main(["run", NAME, "--json", *[part for text in overrides for part in ("--set", text)]]) == 0
    printed = json.loads(capsys.readouterr().out)
    result = mpsim.simulate(NAME, overrides)
    assert result.to_dict() == printed  # equal as it is, tuples of the summary as the JSON's lists
    assert printed["num_microbatches"] == 32 and printed["bubble_s"] > 0


def test_compare_runs_what_mpsim_compare_runs(capsys):
    assert main(["compare", NAME, "--schedules", "1f1b,zbv", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["schedules"]
    compared = mpsim.compare(NAME, ["1f1b", "zbv"])
    assert [(row["schedule"], row["vpp"]) for row in printed] == \
           [(name, r.summary.vpp) for name, r in compared.results.items()]
    for row in printed:
        assert json.loads(json.dumps(compared.results[row["schedule"]].to_dict())) == row["summary"]


def test_chunks_per_rank_are_ones_each_schedule_runs():
    # compare (command and interface) runs each schedule at mpsim.schedules.chunks_per_rank:
    # the scenario's chunks where the schedule takes them, else ones it can build with
    from mpsim.schedules import SCHEDULES, build_schedule, chunks_per_rank
    from mpsim.engine import rank_spans

    for name in SCHEDULES:
        for vpp in (1, 2, 3, 8):
            chunks = chunks_per_rank(name, vpp)
            build_schedule(name, 2, chunks, 4 * chunks, timer=rank_spans)
            kind = SCHEDULES[name]
            if kind.max_vpp is None and vpp == 1:
                # a schedule that interleaves is compared interleaved: one chunk would repeat
                # another schedule's row
                assert chunks == 2, (name, vpp)
            elif kind.min_vpp <= vpp and (kind.max_vpp is None or vpp <= kind.max_vpp):
                assert chunks == vpp, (name, vpp)


def test_writers_write_the_files_of_mpsim_run(tmp_path):
    small = mpsim.simulate(SMALL)
    small.plot(tmp_path / "timeline.svg")
    small.plot_memory(tmp_path / "memory.svg")
    small.write_trace(tmp_path / "step.json")
    small.write_memory_snapshot(tmp_path / "rank0.pickle", rank=0)
    small.write_report(tmp_path / "step.html")
    assert all((tmp_path / name).stat().st_size > 0
               for name in ("timeline.svg", "memory.svg", "step.json", "rank0.pickle", "step.html"))
    assert json.loads((tmp_path / "step.json").read_text())  # a whole JSON document


def test_the_table_shows_step_time_and_marks_out_of_memory(result):
    html = result._repr_html_()
    assert format_seconds(result.summary.step_time_s) in html and html.startswith("<table>")
    assert "OUT OF MEMORY" not in html and not result.summary.out_of_memory
    assert format_seconds(result.summary.step_time_s) in result._repr_markdown_()
    # GPipe holds every microbatch's activations before its first backward: they do not fit
    tight = mpsim.simulate(NAME, {"parallel.schedule": "gpipe"})
    assert tight.summary.out_of_memory
    assert "OUT OF MEMORY" in tight._repr_html_() and "OUT OF MEMORY" in repr(tight)


def test_data_frames_without_pandas_say_how_to_install_it(result, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # what a missing package looks like to import
    with pytest.raises(InputError, match="pip install pandas"):
        result.to_dataframe()


def test_data_frame_has_a_row_per_pipeline_rank(result):
    pytest.importorskip("pandas")
    frame = result.to_dataframe()
    assert list(frame["rank"]) == list(range(result.summary.pp))
    assert list(frame["peak_memory_bytes"]) == [m.peak_memory_bytes for m in result.summary.memory]


def _bad_inputs(result, tmp_path):
    copy = mpsim.load(NAME).model_copy()  # a scenario that load did not return: no file to apply overrides to
    return [
        lambda: mpsim.load("no-such-scenario"),
        lambda: mpsim.load(NAME, "parallel.tp=4"),
        lambda: mpsim.load(NAME, ["parallel.tp"]),
        lambda: mpsim.load(NAME, {1: 2}),
        lambda: mpsim.load(NAME, {"parallel.no_such_field": 1}),
        lambda: mpsim.load(42),
        lambda: mpsim.simulate(NAME, {"parallel.tp": 3}),
        lambda: mpsim.simulate(copy, {"parallel.tp": 4}),
        lambda: mpsim.compare(NAME, ["1f1b", "no-such-schedule"]),
        lambda: mpsim.compare(NAME, "1f1b"),
        lambda: mpsim.sweep(NAME, ["parallel.tp=1,2"]),
        lambda: mpsim.plan("gpt3-175b", cluster="dgx-a100", devices=0, global_batch=8),
        lambda: mpsim.plan("gpt3-175b", cluster=8, devices=8, global_batch=8),
        lambda: mpsim.plan("gpt3-175b", cluster="dgx-a100", devices=8, global_batch=8, no_such_option=1),
        lambda: result.plot(tmp_path / "no-such-folder" / "timeline.png"),
        lambda: result.plot(tmp_path / "timeline.nope"),
        lambda: result.plot(tmp_path),
        lambda: result.write_memory_snapshot(tmp_path / "snapshot.pickle", rank=result.summary.pp),
    ]


def test_bad_input_raises_one_line_input_errors(result, tmp_path):
    for index, call in enumerate(_bad_inputs(result, tmp_path)):
        with pytest.raises(InputError) as caught:
            call()
        message = str(caught.value)
        assert message and "\n" not in message, (index, message)
    assert not any(tmp_path.iterdir())  # nothing was written on the way


def test_a_loaded_scenario_is_swept_from_its_file_with_its_overrides():
    loaded = mpsim.load(NAME, {"parallel.global_batch_size": 32})
    swept = mpsim.sweep(loaded, {"parallel.microbatch_size": [1]}, workers=1)
    [record] = swept.records
    direct = mpsim.simulate(NAME, {"parallel.global_batch_size": 32}).summary
    assert record["status"] == "ok" and record["metrics"]["num_microbatches"] == direct.num_microbatches == 32


def test_what_load_remembers_leaves_with_the_scenario():
    import gc
    import weakref

    from mpsim.api.scenarios import SOURCES

    scenario = mpsim.load(NAME)
    key, alive = id(scenario), weakref.ref(scenario)
    assert SOURCES[key].reference() is scenario
    del scenario
    gc.collect()
    assert alive() is None and key not in SOURCES  # remembering it did not keep it alive
