"""Pictures and tables at scale and in the model's units: bounded timelines, honest keys and titles,
throughput named by what a sample is, and layouts that do not fit kept off the Pareto front."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib import image

from mpsim.cli.main import main
from mpsim.explore import plots
from mpsim.explore.axes import Axis
from mpsim.explore.runner import RunReport
from mpsim.explore.sweep import SweepResult, format_sweep
from mpsim.results import plot as timeline_plot
from mpsim.results import summarize
from mpsim.results.lanes import choose_ranks, merge_runs
from mpsim.simulate import bubble_reference, simulate
from mpsim.specs import load_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def _simulated(name: str, overrides: list[str] | None = None):
    loaded = load_scenario(str(SCENARIOS / name), overrides or [])
    result = simulate(loaded.scenario, loaded.path.parent)
    reference = bubble_reference(result)
    return result, summarize(result, reference), reference


def _kinds_drawn(fig) -> set[str]:
    """The kinds of the rectangles in the panels, read from the artists themselves."""
    return {artist.get_gid() for ax in fig.axes for artist in ax.get_children()
            if artist.get_gid() in timeline_plot.LABELS and len(artist.get_path().vertices)}


def _kept_figures(monkeypatch) -> list:
    """Figures the timeline module closes, kept open to be read (close them after)."""
    figures: list = []
    monkeypatch.setattr(timeline_plot.plt, "close", figures.append)
    return figures


def test_the_1t_timeline_on_3072_gpus_is_bounded_in_height(tmp_path, monkeypatch):
    result, summary, reference = _simulated("megatron_1t_3072xa100.yaml")
    assert result.timeline.num_ranks == 64
    path = tmp_path / "t.png"
    figures = _kept_figures(monkeypatch)
    timeline_plot.plot_timeline(result, summary, str(path), reference=reference)
    monkeypatch.undo()
    (fig,) = figures
    names = [label.get_text() for label in fig.axes[0].get_yticklabels()]
    title = fig.axes[0].get_title(loc="left")
    plt.close(fig)
    height_px, width_px = image.imread(path).shape[:2]
    assert height_px <= 1800 and width_px <= 2400
    # a subset of the 64 ranks, and the picture says which
    assert len(names) <= timeline_plot.MAX_LANES
    assert names[0].startswith("rank 0 ") and names[-1].startswith("rank 63 ") and "first" in names[0]
    assert "showing" in title and "of 64 pipeline ranks" in title


@pytest.mark.parametrize("name, overrides", [("llama3_70b_32xh100.yaml", []),
                                             ("gpt3_175b_64xa100.yaml", ["parallel.schedule=zb-h1", "parallel.vpp=1"])])
def test_the_legend_lists_exactly_the_kinds_drawn(name, overrides):
    result, summary, reference = _simulated(name, overrides)
    fig = timeline_plot.timeline_figure([(result, summary, "")], [reference])
    try:
        drawn = _kinds_drawn(fig)
        legend = {text.get_text() for text in fig.legends[0].get_texts()}
    finally:
        plt.close(fig)
    assert legend == {timeline_plot.LABELS[kind] for kind in drawn}
    assert {"F", "B"} <= drawn
    assert ("W" in drawn) == (result.schedule.name == "zb-h1")  # only a split backward has weight-grad blocks


def test_the_titles_follow_set_of_the_system(tmp_path, monkeypatch):
    figures = _kept_figures(monkeypatch)
    path, memory_path = tmp_path / "t.png", tmp_path / "m.png"
    assert main(["run", str(SCENARIOS / "megatron_22b_8xa100.yaml"), "--set", "cluster.system=dgx-h100",
                 "--plot", str(path), "--memory-plot", str(memory_path)]) == 0
    titles = [ax.get_title(loc="left") for fig in figures for ax in fig.axes if ax.get_title(loc="left")]
    monkeypatch.undo()
    for fig in figures:
        plt.close(fig)
    assert path.exists() and memory_path.exists() and len(figures) == 2 and titles
    assert all("h100" in title.lower() and "a100" not in title.lower() for title in titles)


def test_an_image_model_reports_images_per_second(capsys):
    assert main(["run", str(SCENARIOS / "vit_h14_32xa100.yaml")]) == 0
    text = capsys.readouterr().out
    assert "images/s" in text and "tokens/s" not in text


def test_a_language_model_keeps_tokens_per_second(capsys):
    assert main(["run", str(SCENARIOS / "megatron_22b_8xa100.yaml")]) == 0
    assert "tokens/s" in capsys.readouterr().out


def test_audio_seconds_need_an_audio_sample(capsys):
    code = main(["run", str(SCENARIOS / "vit_h14_32xa100.yaml"), "--set", "model.audio_seconds_per_sample=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "audio_seconds_per_sample" in err[0] and "sample_kind" in err[0]


def _record(tp: int, memory_gib: float, rate: float, fits: bool) -> dict:
    metrics = {"peak_memory_bytes": memory_gib * 2**30, "capacity_bytes": 80 * 2**30, "tokens_per_s": rate,
               "out_of_memory": not fits, "step_time_s": 1.0}
    return {"status": "ok", "error": None, "point": {"parallel.tp": tp}, "metrics": metrics}


def test_the_pareto_front_holds_no_layout_that_does_not_fit(tmp_path):
    records = [_record(1, 40, 100.0, True), _record(2, 60, 150.0, True), _record(3, 70, 140.0, True),
               _record(4, 90, 500.0, False), _record(5, 30, 900.0, False), None]
    front = plots.pareto(records, tmp_path / "p.png")
    # by hand: of the fitting ones, tp 3 is beaten by tp 2 (less memory, faster); the two that
    # do not fit beat everything and would be the whole front if they counted
    assert [r["point"]["parallel.tp"] for r in front] == [1, 2]
    assert not any(r["metrics"]["out_of_memory"] for r in front)


def test_sweep_table_marks_layouts_that_do_not_fit():
    records = [_record(1, 40, 100.0, True), _record(2, 90, 500.0, False)]
    for record in records:
        record["metrics"].update(mfu=0.5, bubble_fraction=0.1)
    report = RunReport(records=records, reused=2)
    text = format_sweep(SweepResult("s.yaml", [Axis(("parallel.tp",), ((1,), (2,)))], [(), ()], report))
    rows = {line.split()[0]: line for line in text.splitlines()[2:4]}
    assert rows["2"].split()[-1] == "OOM" and rows["1"].split()[-1] == "yes"


def test_choose_ranks_keeps_the_first_last_and_busiest():
    busy = [1.0] * 64
    busy[37] = 2.0
    lanes = choose_ranks(busy, 10)
    ranks = [lane.rank for lane in lanes]
    assert len(ranks) == 10 and ranks == sorted(set(ranks))
    assert {0, 37, 63} <= set(ranks)
    assert {lane.rank: lane.role for lane in lanes if lane.role} == {0: "first", 37: "busiest", 63: "last"}
    assert choose_ranks(busy, 10) == lanes  # the same step, the same lanes
    assert [lane.rank for lane in choose_ranks(busy[:8], 10)] == list(range(8))


def test_merge_runs_joins_spans_closer_than_the_gap():
    assert merge_runs([(5.0, 1.0), (0.0, 1.0), (1.5, 1.0)], 0.5) == [(0.0, 2.5), (5.0, 1.0)]
    assert merge_runs([(0.0, 1.0), (1.5, 1.0)], 0.4) == [(0.0, 1.0), (1.5, 1.0)]


def test_a_timeline_of_overlapping_steps_says_its_step_is_a_long_runs(monkeypatch, tmp_path):
    from tests.conftest import load_benchmark

    # the Zero Bubble paper's 6.2B ZB-2p with the optimizer's post-validation: the next step's
    # warm-up runs under this one's cool-down, 63 ms of the 2.009 s step alone
    zb = load_benchmark("published_zero_bubble")
    shape = zb.setups(load_benchmark("published_common").DATA)["6.2B"]
    loaded = load_scenario(zb.ZB_BASE, zb.zero_bubble_overrides("6.2B", shape, 8, 1, 3, 24, "ZB-2p", True))
    result = simulate(loaded.scenario)
    reference = bubble_reference(result)
    summary = summarize(result, reference)
    figures = _kept_figures(monkeypatch)
    timeline_plot.plot_timelines([(result, summary, "")], str(tmp_path / "t.png"), [reference])
    titles = [ax.get_title(loc="left") for fig in figures for ax in fig.axes if ax.get_title(loc="left")]
    monkeypatch.undo()
    for fig in figures:
        plt.close(fig)
    assert summary.cross_step_overlap_s > 0.01
    alone = summary.step_time_s + summary.cross_step_overlap_s
    assert any(f"step {summary.step_time_s:.4g} s in a long run ({alone:.4g} s alone)" in title for title in titles)
