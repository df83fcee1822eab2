"""The report's single HTML file: the page, its stylesheet, its script and its data inline.

Nothing is fetched when the file is opened (no fonts, libraries or images from the
network), so it can be mailed, attached to an issue or opened on a machine without
internet access. The data sits in a ``<script type="application/json">`` element that the
script parses; ``</`` inside it is escaped so no string in the data can end the element.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

SECTIONS = (("summary", "Summary"), ("timeline", "Timeline"), ("bubble", "Bubble"),
            ("comm", "Exposed communication"), ("memory", "Memory"), ("table", "Layouts"))


# the page's script, in load order; one function scope holds them all (strict mode, no globals
# but ``window.mpsimReport``, which lets a test drive the timeline)
SCRIPTS = ("common.js", "timeline.js", "charts.js", "main.js")


def _asset(name: str) -> str:
    return resources.files("mpsim.results.html").joinpath("assets", name).read_text(encoding="utf-8")


def _script() -> str:
    return '(() => {\n"use strict";\n' + "\n".join(_asset(name) for name in SCRIPTS) + "})();"


def _data_json(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/")


def render_page(payload: dict[str, Any]) -> str:
    """The whole HTML document of a report payload (``title``, ``subtitle``, ``runs``, ``table``)."""
    title = html.escape(payload["title"])
    nav = "".join(f'<a href="#{key}">{name}</a>' for key, name in SECTIONS
                  if (key == "table") == bool(payload.get("table")) or (key != "table" and payload["runs"]))
    table_heading = html.escape(payload.get("table", {}).get("heading", "Layouts")) if payload.get("table") else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{_asset("report.css")}
</style>
</head>
<body>
<header><h1>{title}</h1><p>{html.escape(payload.get("subtitle", ""))}</p></header>
<nav>{nav}</nav>
<main>
<section id="table"><h2>{table_heading}</h2><div id="table-body"></div>
<div class="chart" style="display:none;margin-top:10px"><canvas id="scatter-canvas"></canvas></div></section>
<section id="summary"><h2>Summary</h2>
<div class="controls"><select id="run-select" aria-label="result shown"></select></div>
<div class="cards" id="cards"></div></section>
<section id="timeline"><h2>Timeline</h2>
<p class="note"><span id="timeline-note"></span> Scroll to zoom at the pointer, drag to pan, double-click an
action to zoom to it (elsewhere: the whole step), hover for its breakdown. Numbers on blocks are microbatches
(forward|backward for an overlapped pair).</p>
<div class="controls"><button id="zoom-in">zoom in</button><button id="zoom-out">zoom out</button>
<button id="zoom-reset">whole step</button><button id="fold">open all groups</button>
<span class="range" id="range"></span></div>
<div class="legend" id="legend"></div>
<div class="chart"><canvas id="timeline-canvas"></canvas></div></section>
<section id="bubble"><h2>Bubble attribution</h2><div id="bubble-body"></div></section>
<section id="comm"><h2>Exposed communication and optimizer</h2><div id="comm-body"></div></section>
<section id="memory"><h2>Memory per device over the step</h2>
<p class="note">Model state, buffers and reserved memory are the floor; activations rise with each forward and
fall with its backward, and parameters that ZeRO-3 gathers come and go with the passes. Pick ranks to compare (Ctrl/Shift-click for several).</p>
<div class="controls"><select id="memory-ranks" multiple size="4" aria-label="ranks shown"></select></div>
<div class="chart"><canvas id="memory-canvas"></canvas></div></section>
</main>
<div class="tooltip" id="tooltip"></div>
<script type="application/json" id="mpsim-data">{_data_json(payload)}</script>
<script>
{_script()}
</script>
</body>
</html>
"""
