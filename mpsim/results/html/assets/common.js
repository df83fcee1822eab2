// Shared by the report's scripts: the embedded data, formatting, canvas sizing, span search.
const DATA = JSON.parse(document.getElementById("mpsim-data").textContent);
const LEG = DATA.legend;
const RGB = Object.fromEntries(Object.entries(LEG.colors).map(([k, hex]) =>
  [k, [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16))]));
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));

function fmtTime(ns) {
  const a = Math.abs(ns);
  if (a === 0) return "0";
  if (a >= 1e9) return (ns / 1e9).toPrecision(4) + " s";
  if (a >= 1e6) return (ns / 1e6).toPrecision(4) + " ms";
  if (a >= 1e3) return (ns / 1e3).toPrecision(4) + " µs";
  return Math.round(ns) + " ns";
}
const fmtGiB = (b) => (b / 2 ** 30).toFixed(1) + " GiB";
const pct = (x) => (100 * x).toFixed(1) + " %";

function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// first index i with start[i] + duration[i] >= t (arrays sorted by start, spans not overlapping)
function firstEndingAfter(cols, t) {
  let lo = 0, hi = cols.start.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cols.start[mid] + cols.duration[mid] < t) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// first index i with start[i] > t
function firstStartingAfter(cols, t) {
  let lo = 0, hi = cols.start.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cols.start[mid] <= t) lo = mid + 1; else hi = mid;
  }
  return lo;
}

function niceStep(span, target) {
  const raw = span / target, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}
