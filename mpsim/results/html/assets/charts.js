// The summary cards, bubble by cause, exposed communication, memory over the step, and the
// layout tables.
// ---------------------------------------------------------------- summary cards
function throughputText(s) {
  const unit = (s.throughput_unit || "tokens") + "/s";
  const value = s.throughput_per_s !== undefined ? s.throughput_per_s : s.tokens_per_s;
  return Math.round(value).toLocaleString("en-US") + " " + unit;
}

function renderSummary(run) {
  const s = run.summary;
  const cards = [
    ["step time", fmtTime(run.step_ns)],
    ["throughput", throughputText(s)],
    ["MFU", pct(s.mfu)],
    ["bubble", pct(s.bubble_fraction) + " (" + fmtTime(s.bubble_s * 1e9) + ")"],
    ["layout", `TP ${s.tp} · CP ${s.cp} · PP ${s.pp} · DP ${s.dp}` + (s.vpp > 1 ? ` · VPP ${s.vpp}` : "") + (s.ep > 1 ? ` · EP ${s.ep}` : "")],
    ["schedule", `${s.schedule}, ${s.num_microbatches} microbatches of ${s.microbatch_size}`],
    ["peak memory", fmtGiB(s.peak_memory_bytes) + " of " + fmtGiB(s.capacity_bytes), s.out_of_memory],
  ];
  $("cards").innerHTML = cards.map(([k, v, bad]) =>
    `<div class="card${bad ? " bad" : ""}"><div class="k">${esc(k)}</div><div class="v">${esc(v)}${bad ? " — out of memory" : ""}</div></div>`).join("");
}

// ---------------------------------------------------------------- bubble and communication
const IDLE_FIELDS = [["idle_schedule_s", "schedule"], ["idle_imbalance_s", "imbalance"], ["idle_stage_wait_s", "stage-wait"],
  ["idle_transfer_s", "transfer"], ["idle_send_s", "send"]];

function renderBubble(run) {
  const s = run.summary, step = s.step_time_s, ranks = s.ranks;
  const shown = ranks.length <= 64 ? ranks : ranks.filter((_, i) => i % Math.ceil(ranks.length / 64) === 0 || i === ranks.length - 1);
  const idleOf = (r) => IDLE_FIELDS.reduce((a, [f]) => a + r[f], 0);
  const most = Math.max(1e-12, ...ranks.map(idleOf));
  let html = `<p class="note">Idle time of each pipeline rank by cause, as a share of the ${fmtTime(step * 1e9)} step: `
    + `fill and drain ${fmtTime(s.bubble_schedule_s * 1e9)}, stage imbalance ${fmtTime(s.bubble_imbalance_s * 1e9)}, `
    + `communication ${fmtTime(s.bubble_comm_s * 1e9)} (means over ranks); the longest bar is the most idle rank`
    + `${shown.length < ranks.length ? `; ${shown.length} of ${ranks.length} ranks shown, evenly spaced` : ""}.</p><div class="bars">`;
  for (const r of shown) {
    html += `<div class="row"><span class="name">rank ${r.rank}: ${fmtTime(idleOf(r) * 1e9)} idle (${pct(idleOf(r) / step)})</span>`;
    for (const [field, kind] of IDLE_FIELDS) {
      if (r[field] > 0) html += `<span class="bar" title="${esc(LEG.labels[kind])}: ${fmtTime(r[field] * 1e9)}" style="width:${(600 * r[field] / most).toFixed(1)}px;background:${LEG.colors[kind]}"></span>`;
    }
    html += "</div>";
  }
  $("bubble-body").innerHTML = html + "</div>";
}

function renderComm(run) {
  const s = run.summary, step = s.step_time_s;
  const parts = [["exposed tensor-parallel communication", s.exposed_tp_comm_s], ["exposed context-parallel communication", s.exposed_cp_comm_s],
    ["exposed expert-parallel communication", s.exposed_ep_comm_s], ["exposed pipeline transfers", s.exposed_pp_comm_s],
    ["exposed data-parallel communication", s.exposed_dp_comm_s], ["optimizer step", s.optimizer_s]];
  $("comm-body").innerHTML = `<p class="note">Means over pipeline ranks; the share is of the step time.</p><div class="bars">` + parts.map(([name, v]) =>
    `<div class="row"><span class="name">${esc(name)}</span><span class="bar" style="width:${Math.max(1, 600 * v / step).toFixed(1)}px;background:#C44E52"></span>${fmtTime(v * 1e9)} (${pct(v / step)})</div>`).join("") + "</div>";
}

// ---------------------------------------------------------------- memory
function renderMemory(run) {
  const select = $("memory-ranks"), n = run.ranks.length;
  const peaks = run.ranks.map((r) => r.memory.peak);
  const busiest = peaks.indexOf(Math.max(...peaks));
  const defaults = [...new Set([0, busiest, n - 1])];
  select.innerHTML = run.ranks.map((r, i) => `<option value="${i}"${defaults.includes(i) ? " selected" : ""}>rank ${i} (peak ${fmtGiB(r.memory.peak)})</option>`).join("");
  select.onchange = () => drawMemory(run);
  drawMemory(run);
}

function drawMemory(run) {
  const canvas = $("memory-canvas"), chosen = [...$("memory-ranks").selectedOptions].map((o) => +o.value);
  const width = Math.max(400, canvas.parentElement.clientWidth - 2), height = 320, left = 60, right = 130, top = 14, bottom = 30;
  const ctx = sizeCanvas(canvas, width, height);
  const capacity = run.summary.capacity_bytes;
  const ymax = Math.max(capacity, ...chosen.map((r) => run.ranks[r].memory.peak)) * 1.08, tmax = run.step_ns;
  const X = (t) => left + (width - left - right) * t / tmax, Y = (b) => height - bottom - (height - top - bottom) * b / ymax;
  ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#5b6570"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  const gstep = niceStep(ymax / 2 ** 30, 5);
  for (let g = 0; g * 2 ** 30 <= ymax; g += gstep) {
    ctx.fillStyle = "#eef0f2"; ctx.fillRect(left, Y(g * 2 ** 30), width - left - right, 1);
    ctx.fillStyle = "#5b6570"; ctx.fillText(g + " GiB", left - 6, Y(g * 2 ** 30));
  }
  ctx.textAlign = "center";
  const tstep = niceStep(tmax, 8);
  for (let t = 0; t <= tmax; t += tstep) ctx.fillText(fmtTime(t), X(t), height - bottom + 14);
  ctx.strokeStyle = "#b3261e"; ctx.setLineDash([5, 4]); ctx.beginPath(); ctx.moveTo(left, Y(capacity)); ctx.lineTo(width - right, Y(capacity)); ctx.stroke(); ctx.setLineDash([]);
  const ends = [];
  chosen.forEach((r, index) => {
    const m = run.ranks[r].memory, color = `hsl(${(index * 137) % 360} 60% 40%)`;
    ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
    let level = m.resident + m.held[0];
    ctx.moveTo(X(m.time[0]), Y(level));
    for (let i = 1; i < m.time.length; i++) { ctx.lineTo(X(m.time[i]), Y(level)); level = m.resident + m.held[i]; ctx.lineTo(X(m.time[i]), Y(level)); }
    ctx.lineTo(X(tmax), Y(level)); ctx.stroke();
    ends.push({ y: Y(m.peak), text: `rank ${r}: peak ${fmtGiB(m.peak)}`, color });
  });
  // labels in a column on the right, pushed apart so they never overlap
  ends.sort((a, b) => a.y - b.y);
  for (let i = 1; i < ends.length; i++) ends[i].y = Math.max(ends[i].y, ends[i - 1].y + 14);
  ctx.textAlign = "left";
  for (const e of ends) { ctx.fillStyle = e.color; ctx.fillText(e.text, width - right + 6, e.y); }
  ctx.fillStyle = "#b3261e"; ctx.fillText(`capacity ${fmtGiB(capacity)}`, left + 4, Y(capacity) - 8);
}

// ---------------------------------------------------------------- tables (compare, sweep, plan)
function cell(value, column) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (column.format === "time") return fmtTime(value * 1e9);
    if (column.format === "bytes") return fmtGiB(value);
    if (column.format === "percent") return pct(value);
    if (Number.isInteger(value) || Math.abs(value) >= 100) return Math.round(value).toLocaleString("en-US");
    return value.toPrecision(4);
  }
  return String(value);
}

function renderTable(table) {
  const head = table.columns.map((c, i) => `<th class="${i === 0 ? "t" : ""}">${esc(c.label)}</th>`).join("");
  const body = table.rows.map((row) => `<tr class="${row.oom ? "oom" : ""}${row.best ? " best" : ""}">` + table.columns.map((c, i) =>
    `<td class="${i === 0 ? "t" : ""}">${esc(cell(row[c.key], c))}${i === 0 && row.oom ? " (out of memory)" : ""}</td>`).join("") + "</tr>").join("");
  $("table-body").innerHTML = `<p class="note">${esc(table.note || "")}</p><div class="scroll"><table class="data"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
  if (table.scatter) drawScatter(table);
}

function drawScatter(table) {
  const canvas = $("scatter-canvas"), sc = table.scatter;
  canvas.parentElement.style.display = "block";
  const width = Math.max(400, canvas.parentElement.clientWidth - 2), height = 340, left = 80, right = 20, top = 16, bottom = 40;
  const ctx = sizeCanvas(canvas, width, height);
  const pts = table.rows.filter((r) => typeof r[sc.x] === "number" && typeof r[sc.y] === "number");
  if (!pts.length) return;
  const xmax = Math.max(sc.capacity || 0, ...pts.map((r) => r[sc.x])) * 1.05, ymax = Math.max(...pts.map((r) => r[sc.y])) * 1.08;
  const X = (v) => left + (width - left - right) * v / xmax, Y = (v) => height - bottom - (height - top - bottom) * v / ymax;
  ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#5b6570"; ctx.textAlign = "center";
  ctx.fillText(sc.x_label, left + (width - left - right) / 2, height - 8);
  ctx.save(); ctx.translate(14, top + (height - top - bottom) / 2); ctx.rotate(-Math.PI / 2); ctx.fillText(sc.y_label, 0, 0); ctx.restore();
  ctx.strokeStyle = "#cfd5db"; ctx.strokeRect(left, top, width - left - right, height - top - bottom);
  const xcol = table.columns.find((c) => c.key === sc.x) || {}, ycol = table.columns.find((c) => c.key === sc.y) || {};
  ctx.fillStyle = "#5b6570";
  const xs = niceStep(xcol.format === "bytes" ? xmax / 2 ** 30 : xmax, 6) * (xcol.format === "bytes" ? 2 ** 30 : 1);
  for (let v = 0; v <= xmax; v += xs) { ctx.textAlign = "center"; ctx.fillText(cell(v, xcol), X(v), height - bottom + 14); }
  const ys = niceStep(ymax, 5);
  for (let v = 0; v <= ymax; v += ys) { ctx.textAlign = "right"; ctx.fillText(cell(v, ycol), left - 6, Y(v)); }
  if (sc.capacity) {
    ctx.strokeStyle = "#b3261e"; ctx.setLineDash([5, 4]); ctx.beginPath(); ctx.moveTo(X(sc.capacity), top); ctx.lineTo(X(sc.capacity), height - bottom); ctx.stroke(); ctx.setLineDash([]);
    ctx.fillStyle = "#b3261e"; ctx.textAlign = "right"; ctx.fillText("capacity", X(sc.capacity) - 4, top + 10);
  }
  for (const r of pts) {
    const x = X(r[sc.x]), y = Y(r[sc.y]);
    if (r.oom) { ctx.strokeStyle = "#b3261e"; ctx.beginPath(); ctx.moveTo(x - 4, y - 4); ctx.lineTo(x + 4, y + 4); ctx.moveTo(x + 4, y - 4); ctx.lineTo(x - 4, y + 4); ctx.stroke(); }
    else { ctx.fillStyle = r.best ? "#1e6b3a" : "#4C72B0"; ctx.beginPath(); ctx.arc(x, y, r.best ? 5 : 3.5, 0, 2 * Math.PI); ctx.fill(); }
  }
  ctx.textAlign = "left"; ctx.fillStyle = "#5b6570";
  ctx.fillText("● fits   ✕ out of memory" + (pts.some((r) => r.best) ? "   ● (large, green) best" : ""), left + 6, top + 12);
}
