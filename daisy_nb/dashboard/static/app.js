// daisy_nb dashboard: polls /api/state and /api/pictures about once a second and draws them.
// Everything is local: no libraries, no network beyond this server. In a run report
// (dashboard/report.py) the answers are embedded in window.DAISY_NB_REPORT and nothing is fetched.
"use strict";

const REPORT = window.DAISY_NB_REPORT || null;
const TOKEN = new URLSearchParams(location.search).get("token");
const CODES = ["none", "skipped", "done", "waiting", "processing", "orphaned", "failed"];
const css = getComputedStyle(document.documentElement);
const COLOR = {};
for (const k of CODES.slice(1)) COLOR[k] = hex(css.getPropertyValue("--" + k).trim() || "#999999");
COLOR.none = [255, 255, 255];
const LABEL = { done: "done", skipped: "skipped", processing: "processing", waiting: "waiting",
                orphaned: "orphaned", failed: "failed" };

function hex(h) {
  const v = h.replace("#", "");
  return [0, 2, 4].map(i => parseInt(v.slice(i, i + 2), 16));
}
function rgb(c) { return `rgb(${c[0]},${c[1]},${c[2]})`; }
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k);
  return e;
}
function fmt(n) { return n == null ? "–" : Number(n).toLocaleString("en-US"); }
function fmtRate(r) {
  if (r == null) return "–";
  if (r >= 100) return Math.round(r).toLocaleString("en-US");
  if (r >= 10) return r.toFixed(1);
  return r.toFixed(2);
}
function fmtSecs(s) {
  if (s == null || !isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(x).padStart(2, "0")}s`;
  return `${x}s`;
}

async function api(path, query = {}) {
  if (REPORT) {
    if (path in REPORT) return REPORT[path];
    throw new Error("not kept in this report (open the live dashboard of a run for block details)");
  }
  const u = new URL(path, location.href);
  for (const [k, v] of Object.entries(query)) u.searchParams.set(k, v);
  if (TOKEN) u.searchParams.set("token", TOKEN);
  const r = await fetch(u, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function inflate(b64) {
  const bin = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// ---------------------------------------------------------------- tasks
const cards = new Map();

function card(tid) {
  let c = cards.get(tid);
  if (c) return c;
  const node = document.getElementById("task-template").content.firstElementChild.cloneNode(true);
  node.dataset.task = tid;
  node.querySelector(".task-id").textContent = tid;
  document.getElementById("tasks").append(node);
  c = { node, pic: null, picKey: "" };
  cards.set(tid, c);
  return c;
}

const COUNT_KEYS = [
  ["completed", "done", "done"], ["skipped", "skipped", "skipped"], ["processing", "processing", "processing"],
  ["failed", "failed", "failed"], ["orphaned", "orphaned", "orphaned"], ["remaining", "remaining", "waiting"],
  ["total", "total", null],
];

function renderTask(t, mode) {
  const c = card(t.task_id);
  const n = c.node;
  const badge = n.querySelector(".badge");
  let cls = "running", text = t.processing ? "running" : "waiting";
  if (t.done) {
    if (t.failed) { cls = "failed"; text = `${fmt(t.failed)} failed`; }
    else if (t.orphaned) { cls = "failed"; text = "orphaned blocks"; }
    else { cls = "done"; text = "✔ done"; }
  } else if (t.abandoned) { cls = "failed"; text = "abandoned"; }
  else if (mode === "tracking") { cls = t.failed ? "failed" : ""; text = t.failed ? "has failures" : "incomplete"; }
  badge.className = "badge " + cls;
  badge.textContent = text;
  n.querySelector(".rate-value").textContent = fmtRate(t.blocks_per_s);
  n.querySelector(".eta-value").textContent = t.remaining === 0 ? "0s" : fmtSecs(t.eta_s);
  n.querySelector(".eta").title = t.done ? "" : "estimated from the rate over the last 30 s";
  // stacked bar
  const bar = n.querySelector(".bar");
  bar.replaceChildren();
  const tot = Math.max(1, t.total);
  const parts = [["done", t.completed - t.skipped], ["skipped", t.skipped], ["processing", t.processing],
                 ["failed", t.failed], ["orphaned", t.orphaned]];
  for (const [k, v] of parts) {
    if (v > 0) bar.append(el("div", { style: `width:${(100 * v / tot).toFixed(3)}%;background:${rgb(COLOR[k])}`,
                                      title: `${LABEL[k]}: ${fmt(v)}` }));
  }
  bar.setAttribute("aria-label", `${fmt(t.completed)} of ${fmt(t.total)} done`);
  // counts
  const counts = n.querySelector(".counts");
  counts.replaceChildren();
  for (const [key, label, colour] of COUNT_KEYS) {
    if (mode === "tracking" && (key === "processing" || key === "orphaned" || key === "skipped")) continue;
    const sw = colour ? el("span", { class: "sw", style: `background:${rgb(COLOR[colour])}` }) : null;
    counts.append(el("span", { class: "c" }, sw, label + " ",
                     el("span", { class: "count", "data-k": key, text: fmt(t[key]) })));
  }
  if (t.total) {
    counts.append(el("span", { class: "c muted", text: `${(100 * t.completed / t.total).toFixed(1)} %` }));
  }
  if (t.worker_restarts) counts.append(el("span", { class: "c muted", text: `♻ ${t.worker_restarts} restarts` }));
  if (t.job_secs_held) {  // worker-seconds held and busy: what a cluster bills, and how much of it ran blocks
    const busy = Math.min(t.job_secs_busy || 0, t.job_secs_held);
    counts.append(el("span", { class: "c muted job-secs",
                               title: "worker-seconds the task's workers were held, and the share that ran blocks",
                               text: `⏱ ${fmtSecs(t.job_secs_held)} held, ${(100 * busy / t.job_secs_held).toFixed(0)} % busy` }));
  }
  drawChart(n.querySelector(".rate-chart"), t.rate_history || []);
}

function drawChart(cv, hist) {
  const dpr = window.devicePixelRatio || 1, W = 320, H = 120;
  if (cv.width !== W * dpr) { cv.width = W * dpr; cv.height = H * dpr; }
  const g = cv.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#656d76";
  if (hist.length < 2) { g.fillText("collecting…", 10, 20); return; }
  const t0 = hist[0][0], t1 = hist[hist.length - 1][0];
  const ymax = Math.max(1e-9, ...hist.map(p => p[1])) * 1.1;
  const L = 6, R = W - 6, T = 18, B = H - 18;
  const x = t => L + (R - L) * (t - t0) / Math.max(1e-9, t1 - t0);
  const y = v => B - (B - T) * v / ymax;
  g.strokeStyle = "#eaeef2"; g.lineWidth = 1;
  for (let i = 0; i <= 2; i++) { g.beginPath(); g.moveTo(L, T + i * (B - T) / 2); g.lineTo(R, T + i * (B - T) / 2); g.stroke(); }
  g.beginPath();
  g.moveTo(x(hist[0][0]), B);
  for (const [t, v] of hist) g.lineTo(x(t), y(v));
  g.lineTo(x(t1), B);
  g.closePath();
  g.fillStyle = "rgba(9,105,218,.15)"; g.fill();
  g.beginPath();
  hist.forEach(([t, v], i) => (i ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
  g.strokeStyle = "#0969da"; g.lineWidth = 1.5; g.stroke();
  g.fillStyle = "#656d76";
  g.fillText(`max ${fmtRate(ymax / 1.1)}/s`, L, 12);
  g.textAlign = "right";
  g.fillText(`last ${fmtSecs(t1 - t0)}`, R, H - 4);
  g.textAlign = "left";
}

// ---------------------------------------------------------------- pictures
async function drawPicture(tid, p) {
  const c = card(tid);
  const [codes, done] = await Promise.all([inflate(p.codes), inflate(p.done)]);
  const box = c.node.querySelector(".panels");
  const key = `${p.kind}/${p.shape}/${p.panels.length}/${p.h}/${p.w}`;
  const avail = Math.max(200, box.clientWidth || 900);
  const np = p.panels.length;
  const fit = per => {  // the scale at which `per` panels fit in a row
    const maxW = np > 1 ? Math.floor((avail - 10 * (per - 1)) / per) : Math.min(avail, 880);
    const maxH = p.kind === "strip" ? 200 : (np > 1 ? 240 : 420);
    return Math.max(1, Math.min(32, Math.floor(Math.min(maxW / p.w, maxH / p.h))));
  };
  let scale = fit(np);
  if (np > 4 && scale * p.w < 150) scale = fit(Math.ceil(np / 2));  // two rows of bigger panels
  if (c.picKey !== key + "/" + scale) {
    box.replaceChildren();
    p.panels.forEach((label, k) => {
      const cv = el("canvas", { width: p.w * scale, height: p.h * scale, "data-panel": k });
      cv.addEventListener("click", ev => onPixel(tid, k, ev, cv));
      cv.addEventListener("mousemove", ev => { cv.title = pixelText(c, k, ev, cv); });
      box.append(el("div", { class: "panel" }, label ? el("span", { class: "plabel", text: label }) : null, cv));
    });
    c.picKey = key + "/" + scale;
  }
  c.scale = scale;
  c.pic = p;
  const n = p.h * p.w;
  const off = new OffscreenCanvas(p.w, p.h);
  const og = off.getContext("2d");
  const canvases = box.querySelectorAll("canvas");
  const wait = COLOR.waiting, dn = COLOR.done;
  for (let k = 0; k < p.panels.length; k++) {
    const img = og.createImageData(p.w, p.h);
    const d = img.data;
    for (let i = 0; i < n; i++) {
      const code = codes[k * n + i];
      let col;
      if (code === 3) {  // waiting: shaded towards "done" by the done fraction of the pixel
        const f = done[k * n + i] / 255;
        col = [wait[0] + f * (dn[0] - wait[0]), wait[1] + f * (dn[1] - wait[1]), wait[2] + f * (dn[2] - wait[2])];
      } else col = COLOR[CODES[code]];
      d[4 * i] = col[0]; d[4 * i + 1] = col[1]; d[4 * i + 2] = col[2]; d[4 * i + 3] = code === 0 ? 0 : 255;
    }
    og.putImageData(img, 0, 0);
    const g = canvases[k].getContext("2d");
    g.imageSmoothingEnabled = false;
    g.clearRect(0, 0, canvases[k].width, canvases[k].height);
    g.drawImage(off, 0, 0, p.w * scale, p.h * scale);
    if (scale < 6) {  // lone failed pixels are a few screen pixels: ring them so that they are seen
      const rings = [];
      for (let i = 0; i < n && rings.length <= 2000; i++) if (codes[k * n + i] === 6) rings.push(i);
      if (rings.length <= 2000) {
        g.strokeStyle = rgb(COLOR.failed); g.lineWidth = 1.5;
        for (const i of rings) {
          g.beginPath();
          g.arc((i % p.w + .5) * scale, (Math.floor(i / p.w) + .5) * scale, Math.max(4, 1.5 * scale), 0, 2 * Math.PI);
          g.stroke();
        }
      }
    }
    if (scale >= 8) {  // faint grid between blocks
      g.strokeStyle = "rgba(255,255,255,.55)"; g.lineWidth = 1;
      g.beginPath();
      for (let x = 1; x < p.w; x++) { g.moveTo(x * scale + .5, 0); g.lineTo(x * scale + .5, p.h * scale); }
      for (let y = 1; y < p.h; y++) { g.moveTo(0, y * scale + .5); g.lineTo(p.w * scale, y * scale + .5); }
      g.stroke();
    }
  }
  const dims = p.shape.join(" × ");
  let cap = `${dims} blocks`;
  if (p.factor > 1 || p.z_factor > 1) {
    const bits = [];
    if (p.factor > 1) bits.push(p.kind === "strip" ? `${p.factor} blocks per pixel` : `${p.factor}×${p.factor} blocks per pixel`);
    if (p.z_factor > 1) bits.push(`${p.z_factor} slices per panel (worst state shown)`);
    cap += " · " + bits.join(", ");
  } else if (p.kind === "slices") cap += " · one panel per slice of axis 0";
  if (p.kind === "image") cap += " · axis 0 down, axis 1 right";
  c.node.querySelector(".picture-caption").textContent = cap;
}

function pixelAt(c, ev, cv) {
  const rect = cv.getBoundingClientRect();
  return [Math.floor((ev.clientY - rect.top) * (cv.height / rect.height) / c.scale),
          Math.floor((ev.clientX - rect.left) * (cv.width / rect.width) / c.scale)];
}

function pixelText(c, k, ev, cv) {  // which blocks a pixel stands for, in grid indices
  const p = c.pic;
  if (!p) return "";
  const [r, col] = pixelAt(c, ev, cv);
  const f = p.factor, s = p.shape;
  const span = (a, n) => (f > 1 ? `${a * f}–${Math.min(n, (a + 1) * f) - 1}` : `${a}`);
  let where;
  if (p.kind === "strip") {
    const j = r * p.w + col;
    where = f > 1 ? `blocks ${j * f}–${Math.min(s[0], (j + 1) * f) - 1}` : `block ${j}`;
  } else {
    const yx = `${span(r, s[s.length - 2])}, ${span(col, s[s.length - 1])}`;
    where = p.kind === "image" ? `grid (${yx})` : `${p.panels[k]}, (${yx})`;
  }
  return `${where} — click for details`;
}

async function onPixel(tid, panel, ev, cv) {
  const [row, col] = pixelAt(card(tid), ev, cv);
  await showBlock(tid, { panel, r: row, c: col });
}

// ---------------------------------------------------------------- block drawer
function roiText(r) {
  if (!r) return "–";
  return `offset (${r.offset.join(", ")}), shape (${r.shape.join(", ")})`;
}

async function showBlock(tid, query) {
  const drawer = document.getElementById("drawer");
  const body = document.getElementById("drawer-body");
  drawer.hidden = false;
  body.replaceChildren(el("p", { class: "muted", text: "loading…" }));
  let info;
  try { info = await api("/api/block", Object.assign({ task: tid }, query)); }
  catch (e) { body.replaceChildren(el("p", { class: "empty", text: String(e.message || e) })); return; }
  const one = info.blocks_in_pixel === 1;
  document.getElementById("drawer-title").textContent =
    one ? `Block ${info.blocks[0].block_id} of ${tid}` : `${fmt(info.blocks_in_pixel)} blocks of ${tid}`;
  const kids = [];
  if (!one) {
    kids.push(el("p", { class: "muted", text: Object.entries(info.counts).map(([k, v]) => `${k}: ${fmt(v)}`).join(" · ") }));
    if (info.blocks.length) kids.push(el("p", { class: "muted", text: `showing ${info.blocks.length}, failed first` }));
  }
  if (!info.blocks.length) kids.push(el("p", { class: "empty", text: "no block here" }));
  for (const b of info.blocks) {
    const dl = el("dl", {},
      el("dt", { text: "block id" }), el("dd", { class: "block-id", text: String(b.block_id) }),
      el("dt", { text: "status" }), el("dd", {}, el("span", { class: "st " + b.status, text: b.status + (b.skipped ? " (skipped)" : "") })),
      el("dt", { text: "failed attempts" }), el("dd", { text: String(b.failed_attempts) }),
      el("dt", { text: "read ROI" }), el("dd", { text: roiText(b.read_roi) }),
      el("dt", { text: "write ROI" }), el("dd", { text: roiText(b.write_roi) }));
    if (b.cell) dl.append(el("dt", { text: "tracking cell" }), el("dd", { text: `(${b.cell.join(", ")})` }));
    const blk = el("div", { class: "blk", "data-block-id": String(b.block_id), "data-status": b.status }, dl);
    if (b.traceback) blk.append(el("pre", { class: "tb", text: b.traceback }));
    else if (b.status === "failed") blk.append(el("p", { class: "empty", text: "traceback not recorded (see the worker logs)" }));
    kids.push(blk);
  }
  body.replaceChildren(...kids);
}

document.getElementById("drawer-close").addEventListener("click", () => {
  document.getElementById("drawer").hidden = true;
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
});

// ---------------------------------------------------------------- workers and errors
function renderWorkers(ws, runtime) {
  const box = document.getElementById("workers");
  document.getElementById("workers-count").textContent = ws.length ? `(${ws.filter(w => w.alive).length} alive)` : "";
  if (!ws.length) {
    const why = REPORT ? "the run has ended: its workers are in the timeline above" : runtime === "pool" ? "no workers running" : runtime === "tracking" ? "read from block tracking: no workers known"
      : `not shown for the ${runtime} runtime`;
    box.replaceChildren(el("p", { class: "empty", text: why }));
    return;
  }
  const tb = el("tbody");
  for (const w of ws) {
    tb.append(el("tr", { "data-worker": String(w.id) },
      el("td", {}, el("span", { class: "dot " + (w.alive ? "alive" : "dead") }), String(w.id)),
      el("td", { text: w.task }), el("td", { text: (w.pid == null ? "–" : String(w.pid)) + (w.job ? ` · job ${w.job}` : "") }),
      el("td", { text: w.state }), el("td", { text: w.block_id == null ? "–" : String(w.block_id) }),
      el("td", { text: fmtSecs(w.age_s) }), el("td", { text: w.job == null ? "–" : w.job })));
  }
  const head = el("tr", {}, ...["worker", "task", "pid", "state", "current block", "up", "job"].map(h => el("th", { text: h })));
  box.replaceChildren(el("table", {}, el("thead", {}, head), tb));
}

let errKey = null;
function renderErrors(errs) {
  const ol = document.getElementById("errors");
  document.getElementById("errors-count").textContent = errs.length ? `(${errs.length})` : "";
  const key = errs.map(e => `${e.task}/${e.block_id}/${e.t}`).join("|");
  if (key === errKey) return;
  errKey = key;
  if (!errs.length) { ol.replaceChildren(el("li", { class: "empty", text: "none" })); return; }
  ol.replaceChildren(...errs.map(e => {
    const lines = (e.text || "").trim().split("\n");
    const last = lines[lines.length - 1];
    const li = el("li", { class: "error", "data-task": e.task, "data-block-id": e.block_id == null ? "" : String(e.block_id) },
      el("span", { class: "etask", text: e.task }), " ",
      el("span", { text: e.block_id == null ? "worker error" : `block ${e.block_id}` }), " ",
      e.t == null ? null : el("span", { class: "muted", text: new Date(e.t * 1000).toLocaleTimeString() }),
      el("div", { class: "emsg", text: last }));
    li.addEventListener("click", () => {
      if (e.block_id != null) showBlock(e.task, { block_id: e.block_id });
      else {
        const d = document.getElementById("drawer"); d.hidden = false;
        document.getElementById("drawer-title").textContent = `Worker error in ${e.task}`;
        document.getElementById("drawer-body").replaceChildren(el("pre", { class: "tb", text: e.text }));
      }
    });
    return li;
  }));
}

// ---------------------------------------------------------------- worker timeline
const TL_COLORS = ["#0969da", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#1b7c83", "#bf3989", "#57606a"];
let tlData = null;

function tlColor(ti, alpha) {
  const c = hex(TL_COLORS[ti % TL_COLORS.length]);
  return `rgba(${c[0]},${c[1]},${c[2]},${alpha})`;
}

function renderTimeline(tl) {
  tlData = tl;
  const box = document.getElementById("timeline");
  const rows = (tl && tl.rows) || [];
  const running = rows.filter(r => r.state === "running").length;
  document.getElementById("timeline-count").textContent = rows.length ? `(${rows.length} workers, ${running} running)` : "";
  document.getElementById("timeline-legend").replaceChildren(...((tl && tl.tasks) || []).map((t, i) =>
    el("span", {}, el("i", { style: `background:${tlColor(i, 1)}` }), t)));
  if (!rows.length) {
    const why = lastState && lastState.runtime === "serial" ? "not recorded for the serial (in-process) runtime"
      : lastState && lastState.mode === "tracking" ? "read from block tracking: no workers known" : "no workers yet";
    box.replaceChildren(el("p", { class: "empty", text: why }));
    return;
  }
  const span = Number(document.getElementById("timeline-span").value);
  const now = tl.now;
  let t0 = Math.min(...rows.map(r => r.start));
  if (span > 0) t0 = Math.max(t0, now - span);
  const t1 = Math.max(now, t0 + 1e-3);
  const kids = [];
  for (const r of rows) {
    const label = el("span", { class: "tl-label", title: `${r.label} · ${r.task} · pid ${r.pid ?? "–"}` },
      el("span", { class: "tl-state " + r.state, text: r.state }),
      `${r.label} · ${r.task} · ${fmt(r.blocks)} blocks`,
      r.job ? el("span", { class: "tl-job", text: `job ${r.job}` }) : null);
    const cv = el("canvas", { height: "16" });
    kids.push(el("div", { class: "tl-row", "data-key": r.key, "data-state": r.state, "data-job": r.job ?? "",
                          "data-bars": String(r.bars.length), "data-buckets": String(r.buckets.length),
                          "data-blocks": String(r.blocks) }, label, cv));
  }
  const ticks = el("span", { class: "tl-ticks" });
  for (let i = 0; i <= 4; i++) ticks.append(el("span", { text: fmtSecs(t0 + (t1 - t0) * i / 4) }));
  kids.push(el("div", { class: "tl-axis" }, el("span", { class: "tl-pad", text: "time since the run started" }), ticks));
  box.replaceChildren(...kids);
  box.querySelectorAll(".tl-row").forEach((div, i) => drawTimelineRow(div.querySelector("canvas"), rows[i], t0, t1, tl.bucket_s));
}

function drawTimelineRow(cv, r, t0, t1, bucketS) {
  const dpr = window.devicePixelRatio || 1, W = Math.max(100, cv.clientWidth || 600), H = 16;
  cv.width = W * dpr; cv.height = H * dpr;
  const g = cv.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const X = t => (t - t0) / (t1 - t0) * W;
  g.fillStyle = "#eceff2";  // before the worker started and after it ended
  if (r.start > t0) g.fillRect(0, 0, X(r.start), H);
  if (r.end != null && r.end < t1) g.fillRect(X(r.end), 0, W - X(r.end), H);
  for (const [bt, ti, frac] of r.buckets) {  // older history: busy fraction per bucket
    if (bt + bucketS < t0 || bt > t1) continue;
    const h = Math.max(1, frac * (H - 2));
    g.fillStyle = tlColor(ti, 0.75);
    g.fillRect(X(bt), H - 1 - h, Math.max(1, X(bt + bucketS) - X(bt)), h);
  }
  for (const [a, b, ti, , failed, busy] of r.bars) {
    if (b < t0 || a > t1) continue;
    const x0 = X(a), w = Math.max(1, X(b) - x0);
    g.fillStyle = tlColor(ti, 0.3 + 0.7 * busy);
    g.fillRect(x0, 1, w, H - 2);
    if (failed) { g.fillStyle = rgb(COLOR.failed); g.fillRect(x0, 0, Math.max(2, w), 4); }
  }
  if (r.running_since != null && r.running_since < t1) {  // the block running now
    const x0 = X(Math.max(t0, r.running_since));
    g.fillStyle = tlColor(0, 0.25);
    g.fillRect(x0, 1, Math.max(2, W - x0), H - 2);
  }
}

document.getElementById("timeline-span").addEventListener("change", () => { if (tlData) renderTimeline(tlData); });

// ---------------------------------------------------------------- errors by kind
let groupsKey = null;
function renderGroups(gs) {
  const box = document.getElementById("groups");
  const total = gs.reduce((a, g) => a + g.count, 0);
  document.getElementById("groups-count").textContent = gs.length ? `(${fmt(total)} in ${gs.length} kinds)` : "";
  const key = gs.map(g => `${g.task}/${g.type}/${g.shape}/${g.count}`).join("|");
  if (key === groupsKey) return;
  groupsKey = key;
  if (!gs.length) { box.replaceChildren(el("p", { class: "empty", text: "none" })); return; }
  const roi = r => (r && r.write_roi ? ` (write ROI ${roiText(r.write_roi)})` : "");
  box.replaceChildren(...gs.map(g => {
    const meta = [];
    if (g.first_block != null) meta.push(`first block ${g.first_block}${roi(g.first_roi)}`);
    if (g.last_block != null && g.last_block !== g.first_block) meta.push(`last block ${g.last_block}`);
    if (g.log) meta.push(`log ${g.log}`);
    const div = el("div", { class: "grp", "data-task": g.task, "data-type": g.type, "data-count": String(g.count) },
      el("span", { class: "gcount", text: `${fmt(g.count)}×` }), el("span", { class: "gtype", text: g.type }), " ",
      el("span", { class: "muted", text: `in ${g.task}` }),
      el("div", { class: "gmsg", text: g.message || g.shape }),
      meta.length ? el("div", { class: "gmeta", text: meta.join(" · ") }) : null);
    div.addEventListener("click", () => {
      document.getElementById("drawer").hidden = false;
      document.getElementById("drawer-title").textContent = `${fmt(g.count)} × ${g.type} in ${g.task}`;
      const body = [el("p", { class: "muted", text: `message shape: ${g.shape}` })];
      if (meta.length) body.push(el("p", { class: "muted", text: meta.join(" · ") }));
      body.push(el("pre", { class: "tb", text: g.traceback || "" }));
      document.getElementById("drawer-body").replaceChildren(...body);
    });
    return div;
  }));
}

function renderLegend() {
  const lg = document.getElementById("legend");
  lg.replaceChildren(...["done", "skipped", "processing", "waiting", "orphaned", "failed"].map(k =>
    el("span", {}, el("span", { class: "sw", style: `display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;background:${rgb(COLOR[k])}` }), LABEL[k])));
}

function renderAlarms(alarms) {  // the hang alarm (daisy_nb.hang): one paragraph per task that stopped finishing blocks
  const box = document.getElementById("alarms");
  box.hidden = !alarms.length;
  const line = r => `block ${r.block_id} (write ROI ${roiText(r.write_roi)}) on ${r.worker}` +
    (r.pid ? ` (pid ${r.pid})` : "") + (r.running_secs != null ? `, running for ${fmtSecs(r.running_secs)}` : "");
  box.replaceChildren(...alarms.map(a => {
    const head = `⚠ Task ${a.task}: no block finished for ${fmtSecs(a.stalled_secs)} (threshold ` +
      `${fmtSecs(a.threshold_secs)}) while ${a.processing} block(s) are in flight. Is it hung?`;
    const list = el("ul", {}, ...(a.running || []).map(r => el("li", { text: line(r) })));
    return el("div", { class: "alarm-task", "data-task": a.task }, el("p", { text: head }), list);
  }));
}

// ---------------------------------------------------------------- polling
let lastState = null, picsFinal = false, picsBusy = false;

function renderState(s) {
  lastState = s;
  const pill = document.getElementById("run-status");
  const anyFail = s.tasks.some(t => t.failed || t.orphaned);
  if (s.mode === "tracking") {
    pill.className = "pill " + (s.tasks.every(t => t.remaining === 0 && !t.failed) ? "pill-ok" : "pill-wait");
    pill.textContent = "block tracking (read-only)";
  } else if (s.finished) {
    pill.className = "pill " + (anyFail ? "pill-bad" : "pill-ok");
    pill.textContent = anyFail ? "finished with failures" : "finished";
  } else { pill.className = "pill pill-run"; pill.textContent = "running"; }
  pill.dataset.finished = String(s.finished);
  const meta = [];
  if (s.mode === "live") meta.push(`${s.runtime} · ${fmtSecs(s.elapsed_s)} elapsed`);
  else meta.push(s.paths ? s.paths.join(", ") : "");
  document.getElementById("run-meta").textContent = meta.join(" ");
  const tot = s.tasks.reduce((a, t) => a + t.total, 0), done = s.tasks.reduce((a, t) => a + t.completed, 0);
  document.getElementById("overall").textContent = `${fmt(done)} / ${fmt(tot)} blocks`;
  for (const t of s.tasks) renderTask(t, s.mode);
  renderWorkers(s.workers || [], s.mode === "tracking" ? "tracking" : s.runtime);
  document.querySelector("#errors-box h2").firstChild.textContent = s.mode === "tracking" ? "Failed blocks " : "Recent errors ";
  renderErrors(s.errors || []);
  renderAlarms(s.alarms || []);
  renderGroups(s.error_groups || []);
  document.title = `${s.finished ? "✔" : "▶"} ${tot ? Math.floor(100 * done / tot) : 100}% · daisy_nb`;
}

async function pollPictures() {
  if (picsBusy || (picsFinal && lastState && lastState.finished)) return;
  picsBusy = true;
  try {
    const finished = lastState && lastState.finished;
    const pics = await api("/api/pictures");
    await Promise.all(Object.entries(pics.tasks).map(([tid, p]) => drawPicture(tid, p)));
    document.body.dataset.pictures = String(Object.keys(pics.tasks).length);
    if (finished) picsFinal = true;
  } catch (e) { console.warn("pictures:", e); }
  finally { picsBusy = false; }
}

let tlPolled = 0;
async function pollTimeline(final) {
  if (!final && Date.now() - tlPolled < 1900) return;  // every 2 s: it is the largest answer
  tlPolled = Date.now();
  try { renderTimeline(await api("/api/timeline")); }
  catch (e) { console.warn("timeline:", e); }
}

async function tick() {
  let delay = 1000;
  try {
    const s = await api("/api/state");
    document.getElementById("message").hidden = true;
    if (lastState && lastState.finished && !s.finished) picsFinal = false;  // a new run on the same page
    renderState(s);
    await pollPictures();
    await pollTimeline(s.finished);
    if (REPORT) { showReport(s); return; }
    if (s.finished && s.mode === "live") delay = 2000;
  } catch (e) {
    const m = document.getElementById("message");
    m.hidden = false;
    const ended = lastState && lastState.finished;
    m.textContent = ended ? "The run has finished and its dashboard server has stopped: this is its final state."
                          : `lost contact with the dashboard server (${e.message || e}); retrying…`;
    if (!ended) {
      const pill = document.getElementById("run-status");
      pill.className = "pill pill-wait"; pill.textContent = "disconnected";
    }
    delay = 2000;
  }
  document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  setTimeout(tick, document.hidden ? Math.max(delay, 5000) : delay);
}

function showReport(s) {
  const pill = document.getElementById("run-status");
  pill.textContent = "run report · " + pill.textContent;
  const when = s.report ? new Date(s.report.written * 1000).toLocaleString() : "";
  document.getElementById("run-meta").textContent =
    `${s.runtime} · ${fmtSecs(s.elapsed_s)} · written ${when}` + (s.report ? ` by daisy_nb ${s.report.version}` : "");
  document.body.dataset.report = "ready";
}

renderLegend();
const m = /^#block=([^:]+):(\d+)$/.exec(decodeURIComponent(location.hash));
tick().then(() => { if (m) showBlock(m[1], { block_id: m[2] }); });
