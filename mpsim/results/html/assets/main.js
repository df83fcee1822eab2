// Wires the page together: the result shown, the timeline's buttons, the layout table.
// ---------------------------------------------------------------- page
const timeline = new Timeline($("timeline-canvas"), $("tooltip"));

function showRun(index) {
  const run = DATA.runs[index];
  renderSummary(run);
  renderLegend(run);
  timeline.setRun(run);
  renderBubble(run);
  renderComm(run);
  renderMemory(run);
  $("fold").style.display = timeline.group > 1 ? "" : "none";
  $("timeline-note").textContent = timeline.group > 1
    ? `${run.ranks.length} pipeline ranks folded into groups of ${timeline.group}: click a group's name to open it.`
    : `${run.ranks.length} pipeline ranks.`;
}

if (DATA.runs.length) {
  const select = $("run-select");
  if (DATA.runs.length > 1) {
    select.innerHTML = DATA.runs.map((r, i) => `<option value="${i}">${esc(r.title)}</option>`).join("");
    select.onchange = () => showRun(+select.value);
  } else select.style.display = "none";
  $("zoom-in").onclick = () => timeline.zoomAt((timeline.t0 + timeline.t1) / 2, 0.5);
  $("zoom-out").onclick = () => timeline.zoomAt((timeline.t0 + timeline.t1) / 2, 2);
  $("zoom-reset").onclick = () => timeline.reset();
  let folded = true;
  $("fold").onclick = () => { folded = !folded; timeline.foldAll(folded); $("fold").textContent = folded ? "open all groups" : "fold groups"; };
  showRun(0);
} else {
  for (const id of ["summary", "timeline", "bubble", "comm", "memory"]) $(id).style.display = "none";
}
if (DATA.table) renderTable(DATA.table); else $("table").style.display = "none";
window.mpsimReport = { timeline, data: DATA };
document.body.dataset.ready = "1";
