"""Finding things from the command line: --version, ``mpsim list``, "did you mean" for
misspelt names, ``--csv`` tables that agree with ``--json``, and the completers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

import mpsim
from mpsim.cli import main
from tests.conftest import ROOT, SCENARIOS

SMALL = str(SCENARIOS / "validation_2xcpu.yaml")

# kind -> a shipped file of it, and the folders the list of that kind covers
KNOWN = {
    "scenarios": ("scenarios/llama3_70b_32xh100.yaml", ["scenarios", "scenarios/published"]),
    "models": ("scenarios/models/llama3_70b.yaml", ["scenarios/models"]),
    "systems": ("hardware/systems/dgx_h100.yaml", ["hardware/systems"]),
    "accelerators": ("hardware/accelerators/h100_sxm_80gb.yaml", ["hardware/accelerators"]),
}


def _fields(relative: str) -> tuple[str, str]:
    """(name, description) a list row shows: a scenario goes by its file's name (what run and
    the API take), its own name a title before its description."""
    data = yaml.safe_load((ROOT / relative).read_text())
    description = " ".join(data["description"].split())
    if relative.startswith("scenarios/") and not relative.startswith("scenarios/models/"):
        return Path(relative).stem.replace("_", "-"), f"{data['name']}: {description}"
    return data["name"], description


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"mpsim {mpsim.__version__}"


@pytest.mark.parametrize("kind", list(KNOWN))
def test_list_shows_name_file_and_description(kind, capsys):
    file, _ = KNOWN[kind]
    name, description = _fields(file)
    assert main(["list", kind]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if file in line]
    assert len(lines) == 1
    assert name in lines[0]
    assert description[:30] in lines[0]


@pytest.mark.parametrize("kind", list(KNOWN))
def test_list_json_is_every_file_with_its_description(kind, capsys):
    file, folders = KNOWN[kind]
    assert main(["list", kind, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    expected = {str(path.relative_to(ROOT)) for folder in folders for path in (ROOT / folder).glob("*.yaml")}
    assert {row["file"] for row in rows} == expected
    entry = next(row for row in rows if row["file"] == file)
    assert (entry["name"], entry["description"]) == _fields(file)


def test_list_csv_has_the_json_rows(tmp_path, capsys):
    path = tmp_path / "systems.csv"
    assert main(["list", "systems", "--json", "--csv", str(path)]) == 0
    assert list(csv.DictReader(path.open())) == json.loads(capsys.readouterr().out)


def test_unknown_kind_suggests_the_right_one(capsys):
    assert main(["list", "acelerator"]) == 2
    line = _one_error_line(capsys)
    assert "did you mean accelerators?" in line


@pytest.mark.parametrize("argv, suggestion", [
    (["run", SMALL, "--set", "cluster.system=dgx-h10"], "dgx-h100"),
    (["plan", "gpt3-175b", "--cluster", "dgx-a10", "--devices", "8", "--global-batch", "8"], "dgx-a100"),
    (["collective", "--system", "hgx-h20", "--ranks", "8"], "hgx-h200"),
    (["run", SMALL, "--set", "parallel.schedule=1f1c"], "1f1b"),
    (["compare", SMALL, "--schedules", "1f1b,zb-h3"], "zb-h1"),
    (["run", SMALL, "--set", "model=validation-8x51"], "validation-8x512"),
    (["run", "scenarios/llama3_70b_32xh10.yaml"], "scenarios/llama3_70b_32xh100.yaml"),
    (["hardware", "show", "h100-sxm-80g"], "h100-sxm-80gb"),
    # a short name that is part of several names gets those names, not only the nearest spelling
    (["hardware", "show", "h100"], "h100-pcie-server"),
])
def test_misspelt_name_gets_a_suggestion(argv, suggestion, capsys):
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "did you mean" in line and suggestion in line


def test_compare_csv_agrees_with_json(tmp_path, capsys):
    path = tmp_path / "compare.csv"
    assert main(["compare", SMALL, "--schedules", "1f1b,gpipe", "--json", "--csv", str(path)]) == 0
    body = json.loads(capsys.readouterr().out)
    rows = list(csv.DictReader(path.open()))
    assert [row["schedule"] for row in rows] == ["1f1b", "gpipe"]
    for row, entry in zip(rows, body["schedules"]):
        assert float(row["step_time_s"]) == entry["summary"]["step_time_s"]
        assert float(row["peak_memory_bytes"]) == entry["summary"]["peak_memory_bytes"]
        assert row["out_of_memory"] == ("true" if entry["summary"]["out_of_memory"] else "false")


def test_compare_without_schedules_tries_every_registered_one(capsys):
    """Each registered schedule gets a row, run or with the reason it cannot run, and the row of a
    schedule equals its own comparison."""
    from mpsim.schedules import schedule_names

    assert main(["compare", SMALL, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["schedules"]
    assert [row["schedule"] for row in rows] == schedule_names()
    assert main(["compare", SMALL, "--schedules", "1f1b", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)["schedules"][0]
    assert next(row for row in rows if row["schedule"] == "1f1b") == alone


def test_compare_csv_to_stdout_replaces_the_table(capsys):
    assert main(["compare", SMALL, "--schedules", "1f1b", "--csv", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 1 and float(rows[0]["step_time_s"]) > 0


def test_plan_csv_agrees_with_json(tmp_path, capsys):
    path = tmp_path / "plan.csv"
    argv = ["plan", "validation-8x512", "--cluster", "dgx-h100", "--devices", "2", "--global-batch", "4",
            "--workers", "1", "--top", "3", "--json", "--csv", str(path)]
    assert main(argv) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(best) == 3
    for row, entry in zip(rows, best):
        assert int(row["rank"]) == entry["rank"]
        assert float(row["step_time_s"]) == entry["metrics"]["step_time_s"]
        assert int(row["pp"]) * int(row["dp"]) * int(row["tp"]) * int(row["cp"]) == 2
    assert [float(row["step_time_s"]) for row in rows] == sorted(float(row["step_time_s"]) for row in rows)


def test_collective_csv_has_plain_units(tmp_path, capsys):
    path = tmp_path / "collective.csv"
    assert main(["collective", "--system", "dgx-h100", "--ranks", "8", "--size", "1MB,1GB", "--csv", str(path)]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(path.open()))
    assert [float(row["size_bytes"]) for row in rows] == [1e6, 1e9]
    for row, printed in zip(rows, table):
        time_s, algbw, busbw = float(row["time_s"]), float(row["algbw_bytes_per_s"]), float(row["busbw_bytes_per_s"])
        assert algbw == pytest.approx(float(row["size_bytes"]) / time_s)
        assert busbw == pytest.approx(algbw * 2 * 7 / 8)  # all-reduce on 8 ranks
        assert float(printed[4]) == pytest.approx(time_s * 1e6, abs=0.006)  # the table's microseconds


def test_collective_over_whole_nodes_needs_no_rank_count(capsys):
    """--nodes alone is every device of those nodes, the same as giving the count; neither is one line."""
    assert main(["collective", "--system", "dgx-h100", "--nodes", "4", "--size", "1GB"]) == 0
    alone = capsys.readouterr().out
    assert "32 ranks on 4 nodes (8 per node)" in alone
    assert main(["collective", "--system", "dgx-h100", "--nodes", "4", "--ranks", "32", "--size", "1GB"]) == 0
    assert capsys.readouterr().out == alone
    assert main(["collective", "--system", "dgx-h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --ranks") and "--nodes" in err[0]


def test_csv_into_a_missing_folder_is_refused_before_any_work(tmp_path, capsys):
    assert main(["compare", SMALL, "--schedules", "1f1b", "--csv", str(tmp_path / "no" / "x.csv")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("error: --csv")


def test_completers_offer_fields_and_names():
    from mpsim.cli.completion import complete_scenario, complete_scenario_field, complete_schedules, names_completer

    assert "parallel.tp=" in complete_scenario_field("parallel.t")
    assert all(word.startswith("parallel.t") for word in complete_scenario_field("parallel.t"))
    assert "1f1b,zb-h1" in complete_schedules("1f1b,zb-h")
    assert names_completer("system")("dgx-h") == ["dgx-h100"]
    assert "scenarios/llama3_70b_32xh100.yaml" in complete_scenario("scenarios/llama3_7")


def test_sweep_csv_has_the_records_of_the_results_file(tmp_path, capsys):
    path, out = tmp_path / "sweep.csv", tmp_path / "sweep.jsonl"
    assert main(["sweep", SMALL, "--sweep", "parallel.pp=1,2,3", "--workers", "1", "--no-progress",
                 "--out", str(out), "--csv", str(path)]) == 0
    records = {json.dumps(r["point"]): r for r in map(json.loads, out.read_text().splitlines()) if "point" in r}
    rows = list(csv.DictReader(path.open()))
    assert [row["parallel.pp"] for row in rows] == ["1", "2", "3"]
    assert rows[2]["status"] == "invalid" and rows[2]["step_time_s"] == "" and rows[2]["error"]
    for row in rows[:2]:
        record = records[json.dumps({"parallel.pp": int(row["parallel.pp"])})]
        assert float(row["step_time_s"]) == record["metrics"]["step_time_s"]


def test_hardware_list_csv_has_every_accelerator_and_system(tmp_path):
    path = tmp_path / "hardware.csv"
    assert main(["hardware", "list", "--csv", str(path)]) == 0
    rows = list(csv.DictReader(path.open()))
    for kind, folder in (("accelerator", "hardware/accelerators"), ("system", "hardware/systems")):
        names = {yaml.safe_load(p.read_text())["name"] for p in (ROOT / folder).glob("*.yaml")}
        assert {row["name"] for row in rows if row["kind"] == kind} == names
    h100 = next(row for row in rows if row["name"] == "h100-sxm-80gb")
    assert float(h100["memory_bytes"]) == 80 * 2**30
