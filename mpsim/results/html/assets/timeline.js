// The zoomable, foldable canvas timeline of the pipeline ranks.
// ---------------------------------------------------------------- timeline
const ROW_H = 22, FOLD_AT = 24, GUTTER = 92, AXIS_H = 26;

class Timeline {
  constructor(canvas, tooltip) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.expanded = new Set();
    this.drawnRects = 0;
    canvas.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    canvas.addEventListener("mousedown", (e) => this.onDown(e));
    window.addEventListener("mousemove", (e) => this.onMove(e));
    window.addEventListener("mouseup", () => this.onUp());
    canvas.addEventListener("mouseleave", () => { this.tooltip.style.display = "none"; });
    canvas.addEventListener("dblclick", (e) => this.onDouble(e));
    canvas.addEventListener("click", (e) => this.onClick(e));
    window.addEventListener("resize", () => this.draw());
  }

  setRun(run) {
    this.run = run;
    const n = run.ranks.length;
    this.group = n > FOLD_AT ? Math.ceil(n / FOLD_AT) : 1;
    this.expanded.clear();
    this.reset();
  }

  reset() { this.t0 = 0; this.t1 = this.run.step_ns * 1.01; this.draw(); }

  rows() {
    // a row is [first rank, last rank]; a folded group draws its ranks as thin sub-rows
    const n = this.run.ranks.length, rows = [];
    for (let first = 0; first < n; first += this.group) {
      const last = Math.min(n, first + this.group) - 1, g = first / this.group;
      if (this.group > 1 && this.expanded.has(g)) {
        for (let r = first; r <= last; r++) rows.push({ first: r, last: r, group: g, height: ROW_H });
      } else {
        rows.push({ first, last, group: g, height: this.group > 1 ? Math.max(ROW_H, Math.min(48, (last - first + 1) * 3)) : ROW_H });
      }
    }
    let y = AXIS_H;
    for (const row of rows) { row.y = y; y += row.height + 2; }
    return rows;
  }

  draw() {
    if (!this.run) return;
    const width = Math.max(400, this.canvas.parentElement.clientWidth - 2);
    this.layout = this.rows();
    const last = this.layout[this.layout.length - 1];
    const height = last.y + last.height + 6;
    const ctx = sizeCanvas(this.canvas, width, height);
    this.width = width;
    this.k = (width - GUTTER - 8) / (this.t1 - this.t0);
    ctx.clearRect(0, 0, width, height);
    this.drawAxis(ctx, height);
    this.drawnRects = 0;
    this.paintLanes(ctx);
    for (const row of this.layout) { this.labelRow(ctx, row); this.nameRow(ctx, row); }
    $("range").textContent = `${fmtTime(this.t0)} – ${fmtTime(this.t1)} (${fmtTime(this.t1 - this.t0)} shown)`;
    document.body.dataset.drawnRects = String(this.drawnRects);
  }

  x(t) { return GUTTER + (t - this.t0) * this.k; }

  drawAxis(ctx, height) {
    const step = niceStep(this.t1 - this.t0, Math.max(4, Math.floor((this.width - GUTTER) / 110)));
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "center";
    for (let t = Math.ceil(this.t0 / step) * step; t <= this.t1; t += step) {
      const x = this.x(t);
      ctx.fillStyle = "#eef0f2";
      ctx.fillRect(x, AXIS_H - 4, 1, height - AXIS_H);
      ctx.fillStyle = "#5b6570";
      ctx.fillText(fmtTime(t), x, 11);
    }
    const end = this.x(this.run.step_ns);
    if (end >= GUTTER && end <= this.width) {
      ctx.fillStyle = "#1d232b";
      ctx.fillRect(end, AXIS_H - 6, 1.5, height - AXIS_H);
    }
  }

  // Lanes are painted pixel by pixel: each device-pixel column of a rank gets the colours of
  // the spans over it, weighted by how much of the column each covers, so a frame costs the
  // pixels plus the spans in view, however many actions fall in one pixel.
  paintLanes(ctx) {
    const ratio = window.devicePixelRatio || 1, left = Math.round(GUTTER * ratio);
    const cols = Math.max(1, this.canvas.width - left), height = this.canvas.height;
    const image = new ImageData(cols, height), data = image.data;
    const acc = new Float32Array(cols * 3), weight = new Float32Array(cols), line = new Uint8ClampedArray(cols * 4);
    const perNs = this.k * ratio;
    for (const row of this.layout) {
      const count = row.last - row.first + 1, sub = row.height / count;
      for (let r = row.first; r <= row.last; r++) {
        const rank = this.run.ranks[r];
        acc.fill(0); weight.fill(0);
        this.accumulate(rank.idle, (i) => LEG.kinds[rank.idle.kind[i]], acc, weight, perNs, cols);
        this.accumulate(rank.actions, (i) => LEG.action_kinds[rank.actions.kind[i]], acc, weight, perNs, cols);
        this.accumulate(rank.syncs, (i) => LEG.kinds[rank.syncs.kind[i]], acc, weight, perNs, cols);
        line.fill(0);
        for (let c = 0; c < cols; c++) {
          const w = weight[c];
          if (w <= 0) continue;
          const cover = Math.min(1, w), white = 255 * (1 - cover);
          line[4 * c] = acc[3 * c] / w * cover + white;
          line[4 * c + 1] = acc[3 * c + 1] / w * cover + white;
          line[4 * c + 2] = acc[3 * c + 2] / w * cover + white;
          line[4 * c + 3] = 255;
        }
        const top = Math.round((row.y + (r - row.first) * sub) * ratio);
        const bottom = Math.max(top + 1, Math.round((row.y + (r - row.first + 1) * sub - (count > 1 ? 0.5 : 0)) * ratio));
        for (let y = top; y < Math.min(bottom, height); y++) data.set(line, y * cols * 4);
      }
    }
    const layer = this.layer || (this.layer = document.createElement("canvas"));
    layer.width = cols; layer.height = height;
    layer.getContext("2d").putImageData(image, 0, 0);
    ctx.save();
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.drawImage(layer, left, 0);
    ctx.restore();
  }

  accumulate(spans, kindOf, acc, weight, perNs, cols) {
    const n = spans.start.length;
    for (let i = firstEndingAfter(spans, this.t0); i < n && spans.start[i] <= this.t1; i++) {
      const a = Math.max(0, (spans.start[i] - this.t0) * perNs);
      const b = Math.min(cols, (spans.start[i] + spans.duration[i] - this.t0) * perNs);
      if (b <= a) continue;
      const rgb = RGB[kindOf(i)];
      for (let c = Math.floor(a); c < b; c++) {
        const w = Math.min(b, c + 1) - Math.max(a, c);
        acc[3 * c] += rgb[0] * w; acc[3 * c + 1] += rgb[1] * w; acc[3 * c + 2] += rgb[2] * w;
        weight[c] += w;
      }
      this.drawnRects++;
    }
  }

  // microbatch numbers and a hairline between actions, where an action is wide enough
  labelRow(ctx, row) {
    const count = row.last - row.first + 1, sub = row.height / count;
    if (sub < 11) return;
    ctx.font = "10.5px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let r = row.first; r <= row.last; r++) {
      const a = this.run.ranks[r].actions, y = row.y + (r - row.first) * sub;
      const first = firstEndingAfter(a, this.t0), last = firstStartingAfter(a, this.t1);
      if (last - first > (this.width - GUTTER) / 4) continue;
      for (let i = first; i < last; i++) {
        const x0 = Math.max(GUTTER, this.x(a.start[i])), x1 = Math.min(this.width, this.x(a.start[i] + a.duration[i]));
        if (x1 - x0 < 4) continue;
        ctx.fillStyle = "rgba(255,255,255,0.9)";
        ctx.fillRect(x1 - 1, y, 1, sub - 0.5);
        const text = a.pair[i] >= 0 ? `${a.microbatch[i]}|${a.pair[i]}` : String(a.microbatch[i]);
        if (x1 - x0 > 16 && ctx.measureText(text).width + 4 < x1 - x0) {
          ctx.fillStyle = "#fff";
          ctx.fillText(text, (x0 + x1) / 2, y + sub / 2 + 0.5);
        }
      }
    }
  }

  nameRow(ctx, row) {
    const count = row.last - row.first + 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    ctx.fillStyle = "#1d232b";
    ctx.font = "11.5px system-ui, sans-serif";
    let name = count === 1 ? `rank ${row.first}` : `ranks ${row.first}–${row.last}`;
    if (this.group > 1) name = (this.expanded.has(row.group) ? "▾ " : "▸ ") + name;
    ctx.fillText(name, GUTTER - 8, row.y + row.height / 2);
  }

  // --- interaction
  hit(e) {
    const box = this.canvas.getBoundingClientRect(), x = e.clientX - box.left, y = e.clientY - box.top;
    const row = (this.layout || []).find((r) => y >= r.y && y < r.y + r.height);
    if (!row) return null;
    const count = row.last - row.first + 1;
    const rank = Math.min(row.last, row.first + Math.floor((y - row.y) / (row.height / count)));
    const t = this.t0 + (x - GUTTER) / this.k;
    const hitIn = (cols) => {
      const i = firstEndingAfter(cols, t);
      return i < cols.start.length && cols.start[i] <= t ? i : -1;
    };
    const data = this.run.ranks[rank];
    let i = hitIn(data.actions);
    if (i >= 0) return { x, row, rank, t, what: "action", i };
    i = hitIn(data.syncs);
    if (i >= 0) return { x, row, rank, t, what: "sync", i };
    i = hitIn(data.idle);
    if (i >= 0) return { x, row, rank, t, what: "idle", i };
    return { x, row, rank, t, what: null };
  }

  describe(h) {
    const rank = this.run.ranks[h.rank];
    if (h.what === "action") {
      const a = rank.actions, kind = LEG.action_kinds[a.kind[h.i]], cost = this.run.costs[a.cost[h.i]];
      const mb = a.pair[h.i] >= 0 ? `forward ${a.microbatch[h.i]}, backward ${a.pair[h.i]}` : a.microbatch[h.i];
      let html = `<b>${esc(LEG.labels[kind])}</b> · rank ${h.rank} · model chunk ${a.chunk[h.i]} · microbatch ${esc(mb)}<br>`
        + `starts ${fmtTime(a.start[h.i])}, takes ${fmtTime(a.duration[h.i])} (${cost.tflop} TFLOP)<table>`;
      for (const [name, ns] of cost.ops) html += `<tr><td>${esc(name)}</td><td class="n">${fmtTime(ns)}</td></tr>`;
      for (const [group, ns] of cost.exposed) html += `<tr><td>exposed ${esc(group)} communication</td><td class="n">${fmtTime(ns)}</td></tr>`;
      return html + "</table>";
    }
    if (h.what === "sync") {
      const s = rank.syncs, kind = LEG.kinds[s.kind[h.i]];
      return `<b>${esc(LEG.labels[kind])}</b> · rank ${h.rank}<br>${esc(s.label[h.i])}<br>starts ${fmtTime(s.start[h.i])}, takes ${fmtTime(s.duration[h.i])}`;
    }
    if (h.what === "idle") {
      const d = rank.idle, kind = LEG.kinds[d.kind[h.i]];
      return `<b>${esc(LEG.labels[kind])}</b> · rank ${h.rank}<br>from ${fmtTime(d.start[h.i])} for ${fmtTime(d.duration[h.i])}`;
    }
    return null;
  }

  onWheel(e) {
    e.preventDefault();
    const box = this.canvas.getBoundingClientRect();
    this.zoomAt(this.t0 + (e.clientX - box.left - GUTTER) / this.k, Math.exp(e.deltaY * 0.0015));
  }

  zoomAt(t, factor) {
    const span = Math.max(1000, (this.t1 - this.t0) * factor), full = this.run.step_ns * 1.01;
    const share = (t - this.t0) / (this.t1 - this.t0);
    this.setView(t - share * span, t - share * span + span, full);
  }

  setView(t0, t1, full) {
    full = full || this.run.step_ns * 1.01;
    const span = Math.min(full, Math.max(1000, t1 - t0));
    t0 = Math.max(0, Math.min(t0, full - span));
    this.t0 = t0; this.t1 = t0 + span;
    this.draw();
  }

  onDown(e) { this.drag = { x: e.clientX, t0: this.t0, t1: this.t1 }; this.canvas.classList.add("dragging"); }
  onUp() { this.drag = null; this.canvas.classList.remove("dragging"); }

  onMove(e) {
    if (this.drag) {
      const dt = (e.clientX - this.drag.x) / this.k;
      this.setView(this.drag.t0 - dt, this.drag.t1 - dt);
      return;
    }
    if (e.target !== this.canvas) return;
    const h = this.hit(e), html = h && this.describe(h);
    if (!html) { this.tooltip.style.display = "none"; return; }
    this.tooltip.innerHTML = html;
    this.tooltip.style.display = "block";
    const left = Math.min(e.clientX + 14, window.innerWidth - this.tooltip.offsetWidth - 8);
    const top = Math.min(e.clientY + 14, window.innerHeight - this.tooltip.offsetHeight - 8);
    this.tooltip.style.left = left + "px";
    this.tooltip.style.top = top + "px";
  }

  onClick(e) {
    const box = this.canvas.getBoundingClientRect();
    if (e.clientX - box.left >= GUTTER || this.group === 1) return;
    const h = this.hit(e);
    if (!h) return;
    if (this.expanded.has(h.row.group)) this.expanded.delete(h.row.group); else this.expanded.add(h.row.group);
    this.draw();
  }

  onDouble(e) {
    const h = this.hit(e);
    if (h && h.what === "action") {
      const a = this.run.ranks[h.rank].actions, pad = a.duration[h.i] * 0.15;
      this.setView(a.start[h.i] - pad, a.start[h.i] + a.duration[h.i] + pad);
    } else this.reset();
  }

  foldAll(fold) {
    if (this.group === 1) return;
    this.expanded.clear();
    if (!fold) for (let g = 0; g * this.group < this.run.ranks.length; g++) this.expanded.add(g);
    this.draw();
  }
}

function renderLegend(run) {
  const used = new Set();
  for (const rank of run.ranks) {
    rank.actions.kind.forEach((k) => used.add(LEG.action_kinds[k]));
    rank.idle.kind.forEach((k) => used.add(LEG.kinds[k]));
    rank.syncs.kind.forEach((k) => used.add(LEG.kinds[k]));
  }
  const order = LEG.action_kinds.concat(LEG.kinds.filter((k) => !LEG.action_kinds.includes(k)));
  $("legend").innerHTML = order.filter((k) => used.has(k)).map((k) =>
    `<span><span class="sw" style="background:${LEG.colors[k]}"></span>${esc(LEG.labels[k])}</span>`).join("");
}
