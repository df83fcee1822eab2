"""The HTML report (mpsim/results/html): its data, its self-containment, and the page in a real browser.

The browser tests open the report in headless Chromium (Debian's ``chromium`` package,
driven by Playwright) with every network request refused, and check that it renders
without console errors, that zooming narrows the timeline's window, that hovering an
action shows its breakdown, and that a screenshot of the timeline is not blank. They are
skipped where Playwright or Chromium is missing; ``.ci/run`` installs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from mpsim.cli.main import main
from tests.conftest import ROOT

SCENARIO = ROOT / "scenarios" / "megatron_1t_512xa100.yaml"


def _payload(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="mpsim-data">(.*?)</script>', text, re.S)
    assert found is not None
    return json.loads(found.group(1))


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(SCENARIO), "-o", str(path)]) == 0
    return path


def test_the_payload_holds_every_simulated_action(report):
    from mpsim.simulate import simulate
    from mpsim.specs import load_scenario

    result = simulate(load_scenario(SCENARIO).scenario)
    run = _payload(report)["runs"][0]
    assert len(run["ranks"]) == result.timeline.num_ranks
    for rank, records in zip(run["ranks"], result.timeline.actions):
        actions = rank["actions"]
        assert len(actions["start"]) == len(records)
        # whole nanoseconds, in order, each action where the engine put it
        assert actions["start"] == sorted(actions["start"])
        assert actions["start"][0] == round(records[0].start_s * 1e9)
        assert all(isinstance(t, int) for t in actions["start"] + actions["duration"])
    assert run["step_ns"] == round(result.timeline.step_time_s * 1e9)


def test_the_page_loads_nothing_from_the_network(report):
    text = report.read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)


def test_data_cannot_end_its_script_element(tmp_path):
    path = tmp_path / "r.html"
    name = "a </script><script>alert(1)</script> b"
    assert main(["report", "megatron_22b_8xa100", "--set", f"name={name}", "-o", str(path)]) == 0
    assert _payload(path)["runs"][0]["summary"]["scenario"] == name
    assert path.read_text(encoding="utf-8").count("</script>") == 2  # the data element's and the script's


def test_run_writes_the_same_report_as_the_report_command(tmp_path, capsys):
    by_run, by_report = tmp_path / "run.html", tmp_path / "report.html"
    assert main(["run", "megatron_22b_8xa100", "--report", str(by_run)]) == 0
    assert main(["report", "megatron_22b_8xa100", "-o", str(by_report)]) == 0
    assert by_run.read_bytes() == by_report.read_bytes()


def _chromium() -> str | None:
    for candidate in (os.environ.get("MPSIM_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    if executable is None:
        pytest.skip("no Chromium (Debian package chromium) on this machine")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        yield launched
        launched.close()


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    requested: list[str] = []

    def refuse(route):
        requested.append(route.request.url)
        route.abort()

    page.route(re.compile(r"^(?!file:).*"), refuse)
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=20_000)
    return page, problems, requested


def test_the_report_renders_zooms_and_explains_an_action(browser, report, tmp_path):
    page, problems, requested = _open(browser, report)
    view = lambda: page.evaluate("[mpsimReport.timeline.t0, mpsimReport.timeline.t1]")  # noqa: E731
    step_ns = page.evaluate("mpsimReport.data.runs[0].step_ns")
    start, end = view()
    assert start == 0 and end >= step_ns
    canvas = page.locator("#timeline-canvas")
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 60)
    for _ in range(5):
        page.mouse.wheel(0, -400)
    page.wait_for_timeout(100)
    zoomed = view()
    assert zoomed[1] - zoomed[0] < 0.5 * (end - start)
    # zoom to rank 0's first backward and hover its middle: the tooltip lists its ops
    first = page.evaluate("""(() => { const a = mpsimReport.data.runs[0].ranks[0].actions;
        const i = a.kind.indexOf(1); return [a.start[i], a.duration[i]]; })()""")
    page.evaluate(f"mpsimReport.timeline.setView({first[0]}, {first[0] + first[1]})")
    row = page.evaluate("mpsimReport.timeline.layout[0]")
    page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + row["y"] + 2)
    page.wait_for_timeout(100)
    tooltip = page.locator("#tooltip")
    assert tooltip.is_visible()
    assert "backward" in tooltip.inner_text() and "rank 0" in tooltip.inner_text()
    page.evaluate("mpsimReport.timeline.reset()")
    shot = tmp_path / "timeline.png"
    canvas.screenshot(path=str(shot))
    _assert_not_blank(shot)
    assert not problems, problems
    assert not requested, requested
    page.close()


def _assert_not_blank(path: Path) -> None:
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(path))[..., :3]
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    inked = np.mean(pixels.sum(axis=2) < 2.9)  # not white
    assert len(colours) > 8 and inked > 0.2, (len(colours), inked)


def test_compare_report_marks_out_of_memory_and_never_picks_it(tmp_path):
    path = tmp_path / "compare.html"
    # pp 4 x tp 2 on 8 A100: zb-h1 and zbv hold more activations than fit, 1f1b and interleaved fit
    argv = ["compare", "megatron_22b_8xa100", "--schedules", "1f1b,interleaved-1f1b,zb-h1,zbv", "--set",
            "parallel.pp=4", "--set", "parallel.tp=2", "--set", "parallel.global_batch_size=64", "--set",
            "parallel.recompute=full", "--report", str(path)]
    assert main(argv) == 0
    payload = _payload(path)
    rows = payload["table"]["rows"]
    assert [row["schedule"] for row in rows] == ["1f1b", "interleaved-1f1b", "zb-h1", "zbv"]
    assert [row["oom"] for row in rows] == [run["summary"]["out_of_memory"] for run in payload["runs"]]
    assert any(row["oom"] for row in rows) and not all(row["oom"] for row in rows)
    best = [row for row in rows if row.get("best")]
    assert len(best) == 1 and not best[0]["oom"]
    assert best[0]["step_time_s"] == min(row["step_time_s"] for row in rows if not row["oom"])
    assert len(payload["runs"]) == 4


def test_sweep_report_shows_the_best_fitting_point_in_full(tmp_path, capsys):
    path = tmp_path / "sweep.html"
    assert main(["sweep", "megatron_22b_8xa100", "--sweep", "parallel.tp=4,8", "--sweep",
                 "parallel.microbatch_size=1,2", "--workers", "1", "--report", str(path)]) == 0
    payload = _payload(path)
    rows = payload["table"]["rows"]
    fitting = [row for row in rows if row["status"] == "ok"]
    assert fitting and rows[:len(fitting)] == fitting  # fits first, fastest first
    assert [row["step_time_s"] for row in fitting] == sorted(row["step_time_s"] for row in fitting)
    assert fitting[0].get("best") and not any(row.get("best") for row in rows[1:])
    assert all(row["oom"] == (row["status"] == "out of memory") for row in rows)
    (run,) = payload["runs"]
    assert run["summary"]["tp"] == fitting[0]["parallel.tp"]
    assert run["summary"]["step_time_s"] == pytest.approx(fitting[0]["step_time_s"], rel=1e-9)


def test_plan_report_lists_what_it_simulated(tmp_path, capsys):
    path = tmp_path / "plan.html"
    assert main(["plan", "validation-8x512", "--cluster", "dgx-h100", "--devices", "2", "--global-batch", "4",
                 "--workers", "1", "--report", str(path)]) == 0
    payload = _payload(path)
    rows = payload["table"]["rows"]
    assert rows and rows[0].get("best") and not rows[0]["oom"]
    assert payload["runs"][0]["summary"]["step_time_s"] == pytest.approx(rows[0]["step_time_s"], rel=1e-9)
