"""``mpsim sweep`` and ``mpsim plan`` on the command line: tables, plots, one-line errors."""

from __future__ import annotations

import json

from mpsim.cli import main
from mpsim.explore import pools
from tests.conftest import SCENARIOS

PNG = b"\x89PNG\r\n\x1a\n"
SCENARIO = str(SCENARIOS / "llama3_70b_32xh100.yaml")


def test_sweep_prints_a_table_writes_results_and_plots(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    pictures = {name: tmp_path / f"{name}.png" for name in ("heatmap", "pareto", "breakdown")}
    code = main(["sweep", SCENARIO, "--sweep", "parallel.tp=4,8", "--sweep", "parallel.pp=2^1..2", "--workers", "1",
                 "--out", str(out), "--set", "parallel.global_batch_size=32"]
                + [arg for name, path in pictures.items() for arg in (f"--{name}", str(path))])
    assert code == 0
    text = capsys.readouterr().out
    assert "tokens/s" in text and "4 points" in text
    assert len(out.read_text().splitlines()) == 4
    for path in pictures.values():
        assert path.read_bytes()[:8] == PNG


def test_sweep_scaling_curve_over_node_counts(tmp_path, capsys):
    path = tmp_path / "scaling.png"
    code = main(["sweep", str(SCENARIOS / "gpt3_175b_64xa100.yaml"), "--sweep", "cluster.nodes=8,16", "--workers", "1",
                 "--scaling", str(path)])
    assert code == 0
    assert path.read_bytes()[:8] == PNG


def test_the_scaling_plot_prints_no_font_fallback_lines(tmp_path):
    # the log axes' tick labels fall back from a STIX font; as a command (not under pytest, whose
    # log capture would hide them) that is not reported line by line on stderr
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mpsim", "sweep", str(SCENARIOS / "gpt3_175b_64xa100.yaml"),
                             "--sweep", "cluster.nodes=8,16", "--workers", "1", "--scaling", str(tmp_path / "s.png")],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and "findfont" not in result.stderr


def test_sweep_bad_axis_is_one_line_exit_2(capsys):
    assert main(["sweep", SCENARIO, "--sweep", "parallel.tp"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "FIELD=VALUES" in err and "\n" not in err


def test_ray_backend_without_ray_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(pools, "ray_available", lambda: False)
    assert main(["sweep", SCENARIO, "--sweep", "parallel.tp=8", "--backend", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install" in err and "\n" not in err


def test_plan_prints_best_layouts_reasons_and_plots(tmp_path, capsys):
    model = tmp_path / "small.yaml"
    model.write_text("name: gpt-small\nnum_layers: 8\nhidden_size: 1024\nffn_hidden_size: 4096\n"
                     "num_attention_heads: 16\nvocab_size: 32000\nseq_length: 1024\n")
    pictures = {name: tmp_path / f"{name}.png" for name in ("heatmap", "pareto", "breakdown")}
    out = tmp_path / "plan.jsonl"
    args = ["plan", str(model), "--cluster", "dgx-h100", "--devices", "8", "--global-batch", "16", "--top", "3",
            "--workers", "1", "--schedules", "1f1b", "--max-microbatch", "2", "--find", "tp=1,pp=1,dp=8",
            "--out", str(out)] + [arg for name, path in pictures.items() for arg in (f"--{name}", str(path))]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "best 3 layouts" in text and "why the others lost" in text and "where tp=1 pp=1 dp=8 landed" in text
    for path in pictures.values():
        assert path.read_bytes()[:8] == PNG
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["status"] for r in records} >= {"ok"}
    # the rerun reuses every record and prints the same ranking
    assert main(args) == 0
    again = capsys.readouterr().out
    assert "reused from the results file" in again
    assert again.split("best 3 layouts")[1].split("why")[0] == text.split("best 3 layouts")[1].split("why")[0]


def test_plan_without_devices_is_one_line_exit_2(capsys):
    assert main(["plan", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--devices" in err and "\n" not in err


def test_plan_unknown_model_is_one_line_exit_2(capsys):
    assert main(["plan", "gpt-nonexistent", "--cluster", "dgx-a100", "--devices", "8", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_an_empty_heatmap_cell_is_oom_only_when_none_of_its_layouts_fits():
    from mpsim.explore.plots import empty_cell_reason

    # a cell whose layouts include one that fits but was cut by the plan's bound is not OOM
    assert empty_cell_reason({"OOM", "bound"}) == "bound"
    # layouts that could run and do not fit say more than those that cannot run
    assert empty_cell_reason({"OOM", "invalid"}) == "OOM"
    assert empty_cell_reason({"invalid"}) == "invalid"
    assert empty_cell_reason({"OOM"}) == "OOM"


def test_heatmap_options_are_checked_before_the_sweep_runs(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    picture = str(tmp_path / "h.png")
    for extra, fragment in ((["--heatmap-metric", "foo"], "--heatmap-metric: unknown metric 'foo'"),
                            ([], "--heatmap: needs two swept fields (swept: parallel.tp)"),
                            (["--heatmap-axes", "parallel.tp,parallel.zz"], "'parallel.zz' is neither swept")):
        assert main(["sweep", SCENARIO, "--sweep", "parallel.tp=4,8", "--workers", "1", "--out", str(out),
                     "--heatmap", picture, *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and fragment in captured.err  # no table: nothing ran
        assert not out.exists()
    # a layout number the points report (dp, from tp and pp) is an axis; points without metrics
    # (invalid ones) have no cell rather than stopping the picture
    assert main(["sweep", SCENARIO, "--sweep", "parallel.tp=2,4,8", "--sweep", "parallel.pp=2,4,8", "--workers", "1",
                 "--heatmap", picture, "--heatmap-axes", "parallel.tp,parallel.dp"]) in (0, 3)
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG


def test_a_resumed_plan_writes_the_same_report(tmp_path, capsys):
    # records read back from the results file have their keys sorted; the report keeps the
    # plan's field order (with dp beside pp) either way
    args = ["plan", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512",
            "--workers", "1", "--out", str(tmp_path / "r.jsonl")]
    assert main([*args, "--report", str(tmp_path / "fresh.html")]) == 0
    assert main([*args, "--report", str(tmp_path / "resumed.html")]) == 0
    capsys.readouterr()
    fresh = (tmp_path / "fresh.html").read_bytes()
    assert fresh == (tmp_path / "resumed.html").read_bytes() and b"parallel.dp" in fresh
