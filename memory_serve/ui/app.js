// MIA memory inspector: plain DOM over memory_serve's JSON routes (no framework, no build step).
// Data is only ever written with textContent (never innerHTML), so stored text cannot run code.
"use strict";

const CATEGORIES = ["location", "human", "time", "career", "process", "definition", "event",
  "function", "property", "others"];
const SVG = "http://www.w3.org/2000/svg";
const state = { offset: 0, total: 0, runId: null };

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Every request carries X-MIA-UI (required with a session cookie for anything but GET).
async function api(path, body) {
  const opts = { headers: { "X-MIA-UI": "1" }, credentials: "same-origin" };
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  let data = null;
  try { data = await resp.json(); } catch (_) { data = null; }
  if (!resp.ok) {
    const msg = (data && data.error && data.error.message) || resp.statusText;
    if (resp.status === 401) throw new Error("not signed in (reload /ui to sign in): " + msg);
    throw new Error(`HTTP ${resp.status}: ${msg}`);
  }
  return data;
}

function showError(err) {
  const box = $("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = String(err.message || err);
}

function fmt(x, digits = 4) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
}

// A number cell: the exact value in data-value, a rounded one shown.
function numCell(x, digits = 4) {
  return el("td", { class: "num", dataset: { value: String(x) } }, fmt(x, digits));
}

// A stored time Date cannot hold (NaN, 1e308 from a crafted backup) shows as "–" instead of
// throwing and leaving the whole table empty.
function when(epoch) {
  const date = new Date(typeof epoch === "number" ? epoch * 1000 : NaN);
  const year = date.getUTCFullYear();
  if (!(year >= 0 && year <= 9999)) return "–";
  return date.toISOString().replace("T", " ").slice(0, 19);
}

function clip(text, n) {
  const t = String(text || "");
  return t.length > n ? t.slice(0, n - 1) + "…" : t;
}

// ------------------------------------------------------------------------------------ tabs

function showTab(name) {
  for (const b of document.querySelectorAll("nav .tab")) {
    b.classList.toggle("active", b.dataset.tab === name);
  }
  for (const p of document.querySelectorAll(".tab-panel")) p.hidden = p.id !== "tab-" + name;
  if (name === "runs") loadRuns().catch(showError);
}

// ------------------------------------------------------------------------------------ store

function storeParams() {
  const p = new URLSearchParams();
  p.set("offset", String(state.offset));
  p.set("limit", $("page-size").value);
  const q = $("search").value.trim();
  if (q) p.set("q", q);
  if ($("filter-judgement").value) p.set("judgement", $("filter-judgement").value);
  if ($("filter-bucket").value) p.set("bucket", $("filter-bucket").value);
  p.set("sort", $("sort").value);
  return p;
}

async function loadStats() {
  const s = await api("/stats");
  $("store-info").textContent =
    `${s.memories} memories · ${s.plan_pairs} plan pairs · embedder ${s.embedder}`;
  const select = $("filter-bucket");
  const keep = select.value;
  select.replaceChildren(el("option", { value: "" }, "all buckets"));
  for (const [bucket, n] of Object.entries(s.buckets)) {
    select.append(el("option", { value: bucket },
      `${bucket} (${n.correct} correct, ${n.incorrect} incorrect)`));
  }
  select.value = keep;
}

let storeSeq = 0;
async function loadStore() {
  const params = storeParams();
  const seq = ++storeSeq;
  const table = $("memories");
  table.dataset.state = "loading";
  const page = await api("/memories?" + params.toString());
  if (seq !== storeSeq) return;  // a newer request was sent meanwhile
  state.total = page.total;
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const m of page.memories) {
    const row = el("tr", { dataset: { id: String(m.id) }, class: "clickable " + m.judgement,
      onclick: () => openMemory(m.id).catch(showError) },
      el("td", { class: "num" }, String(m.id)),
      el("td", { class: "question", title: m.question }, clip(m.question, 140)),
      el("td", { class: "summary", title: m.workflow_summary }, clip(m.workflow_summary, 160)),
      el("td", { class: "judgement" }, m.judgement),
      numCell(m.win_rate, 3),
      el("td", { class: "num", title: `${m.success_count} successes` }, String(m.usage_count)),
      el("td", {}, `${m.modality}/${m.category}`),
      el("td", { class: "when" }, when(m.created_at)));
    body.append(row);
  }
  if (!page.memories.length) {
    body.append(el("tr", {}, el("td", { colspan: "8", class: "muted" }, "no memories match")));
  }
  const first = page.total ? page.offset + 1 : 0;
  const last = page.offset + page.memories.length;
  const info = $("page-info");
  info.textContent = `${first}–${last} of ${page.total}`;
  info.dataset.total = String(page.total);
  $("prev").disabled = page.offset <= 0;
  $("next").disabled = last >= page.total;
  table.dataset.query = params.toString();
  table.dataset.state = "ready";
}

function reloadStore(resetOffset) {
  if (resetOffset) state.offset = 0;
  showError(null);
  loadStore().catch(showError);
}

async function openMemory(id) {
  const d = await api(`/memories/${id}?history=200`);
  const m = d.memory;
  const box = $("detail");
  box.dataset.id = String(m.id);
  $("detail-title").textContent = `Memory ${m.id} (${m.judgement})`;
  const fields = $("detail-fields");
  fields.replaceChildren();
  const add = (k, v) => fields.append(el("dt", {}, k), el("dd", { dataset: { field: k } }, v));
  add("question", m.question);
  if (m.image_caption) add("caption", m.image_caption);
  add("judgement", m.judgement);
  add("win-rate", `${fmt(m.win_rate, 3)} (${m.success_count} / ${m.usage_count})`);
  add("bucket", `${m.modality}/${m.category}`);
  add("source", m.source || "–");
  add("data id", m.data_id || "–");
  add("created", when(m.created_at));
  if (d.plan) add("plan", d.plan);
  $("detail-summary").textContent = m.workflow_summary;
  $("detail-history-title").textContent = `History (${d.uses} use${d.uses === 1 ? "" : "s"})`;
  const body = $("detail-history").tBodies[0];
  body.replaceChildren();
  for (const u of d.history) {
    body.append(el("tr", { class: u.success ? "correct" : "incorrect", dataset: { use: String(u.id) } },
      el("td", { class: "when" }, when(u.created_at)),
      el("td", {}, u.question || "(not recorded)"),
      el("td", { class: "outcome" }, u.success ? "succeeded" : "failed"),
      el("td", {}, u.source || "–"),
      el("td", { class: "num" }, u.result_id === null ? "–" : String(u.result_id))));
  }
  if (!d.history.length) {
    body.append(el("tr", {}, el("td", { colspan: "5", class: "muted" }, "never used yet")));
  }
  $("detail-preview").onclick = () => {
    $("preview-question").value = m.question;
    $("preview-caption").value = m.image_caption || "";
    $("preview-category").value = m.category;
    showTab("preview");
    runPreview().catch(showError);
  };
  box.hidden = false;
}

// ------------------------------------------------------------------------------------ preview

function scoreRows(tbody, items) {
  tbody.replaceChildren();
  for (const s of items) {
    tbody.append(el("tr", { dataset: { id: String(s.id) }, class: "clickable",
      onclick: () => { showTab("store"); openMemory(s.id).catch(showError); } },
      el("td", { class: "num" }, String(s.rank)),
      el("td", { class: "num id" }, String(s.id)),
      el("td", { title: s.workflow_summary }, clip(s.question, 120)),
      numCell(s.similarity, 4), numCell(s.normalised, 4), numCell(s.win_rate, 4),
      numCell(s.score, 4)));
  }
  if (!items.length) {
    tbody.append(el("tr", {}, el("td", { colspan: "7", class: "muted" }, "none")));
  }
}

async function runPreview() {
  showError(null);
  const question = $("preview-question").value.trim();
  if (!question) return;
  const body = { question, explain: true };
  const caption = $("preview-caption").value.trim();
  if (caption) body.image_caption = caption;
  if ($("preview-category").value) body.category = $("preview-category").value;
  const k = $("preview-topk").value;
  if (k !== "") body.mem_top_k = Number(k);
  const panel = $("tab-preview");
  panel.dataset.state = "loading";
  const r = await api("/memory", body);
  const x = r.explain;
  const range = x.similarity_min === null ? "empty bucket"
    : `raw similarity from ${fmt(x.similarity_min)} to ${fmt(x.similarity_max)}`;
  const sim = x.caption_used
    ? `sim = ${x.question_weight}·cos(question) + ${x.caption_weight}·cos(caption)`
    : "sim = cos(question)";
  $("preview-summary").textContent =
    `bucket ${x.modality}/${x.category}: ${x.bucket_size} memories, ${range}. ${sim}; ` +
    `normalised = (sim − min) / (max − min); ` +
    `score = ${x.similarity_weight}·normalised + ${x.win_rate_weight}·win-rate; ` +
    `top ${x.top_k} of each` + (x.pass_num ? `, skipping ${x.pass_num}` : "") +
    (x.min_similarity !== null ? `, raw similarity ≥ ${x.min_similarity}` : "") + ".";
  scoreRows($("preview-positives").tBodies[0], x.positives);
  scoreRows($("preview-negatives").tBodies[0], x.negatives);
  $("preview-context").textContent = r.context;
  panel.dataset.question = question;
  panel.dataset.state = "ready";
}

// ------------------------------------------------------------------------------------ runs

async function loadRuns() {
  const r = await api("/runs");
  $("runs-root").textContent = `Runs under ${r.root}` + (r.truncated ? " (first 500 shown)" : "");
  const list = $("runs-list");
  list.replaceChildren();
  for (const run of r.runs) {
    list.append(el("li", {},
      el("button", { type: "button", class: "run-link", dataset: { id: run.id, kind: run.kind },
        onclick: () => openRun(run.id).catch(showError) },
        `${run.kind === "ttrl" ? "TTRL" : "eval"} · ${run.name}`),
      el("span", { class: "muted" }, " " + when(run.modified))));
  }
  if (!r.runs.length) list.append(el("li", { class: "muted" }, "no runs found"));
  list.dataset.state = "ready";
  if (r.runs.length && !state.runId) await openRun(r.runs[0].id);
}

const SERIES_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];

// A line chart of series over x = 1..n (values in [0, 1]; null = a gap).
function lineChart(title, xs, series) {
  const W = 640, H = 300, L = 48, R = 16, T = 28, B = 40;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart line-chart", role: "img" });
  root.append(svg("title", {}, title));
  const n = xs.length;
  const px = (i) => L + (n <= 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (n - 1));
  const py = (v) => T + (1 - v) * (H - T - B);
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    root.append(svg("line", { x1: L, x2: W - R, y1: py(t), y2: py(t), class: "gridline" }));
    root.append(svg("text", { x: L - 6, y: py(t) + 4, "text-anchor": "end", class: "tick" },
      t.toFixed(2)));
  }
  const step = Math.max(1, Math.ceil(n / 12));
  xs.forEach((x, i) => {
    if (i % step === 0 || i === n - 1) {
      root.append(svg("text", { x: px(i), y: H - B + 16, "text-anchor": "middle", class: "tick" },
        String(x)));
    }
  });
  root.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis" },
    "batch"));
  series.forEach((s, k) => {
    const color = SERIES_COLORS[k % SERIES_COLORS.length];
    let d = "";
    let open = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { open = false; return; }
      const y = py(Math.max(0, Math.min(1, v)));
      d += `${open ? "L" : "M"}${px(i).toFixed(1)},${y.toFixed(1)} `;
      open = true;
    });
    if (d) root.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2,
      class: "series", "data-series": s.key }));
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const dot = svg("circle", { cx: px(i), cy: py(Math.max(0, Math.min(1, v))), r: 3.5,
        fill: color, class: "pt", "data-series": s.key, "data-x": String(xs[i]),
        "data-value": String(v) });
      dot.append(svg("title", {}, `${s.label}, batch ${xs[i]}: ${fmt(v, 3)}`));
      root.append(dot);
    });
    root.append(svg("rect", { x: L + 8 + k * 150, y: 8, width: 12, height: 12, fill: color }));
    root.append(svg("text", { x: L + 24 + k * 150, y: 18, class: "legend" }, s.label));
  });
  return root;
}

// Bars of one value per label (values in [0, 1]).
function barChart(title, labels, values) {
  const W = 640, H = 280, L = 48, R = 16, T = 16, B = 48;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart bar-chart", role: "img" });
  root.append(svg("title", {}, title));
  const py = (v) => T + (1 - v) * (H - T - B);
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    root.append(svg("line", { x1: L, x2: W - R, y1: py(t), y2: py(t), class: "gridline" }));
    root.append(svg("text", { x: L - 6, y: py(t) + 4, "text-anchor": "end", class: "tick" },
      t.toFixed(2)));
  }
  const slot = (W - L - R) / Math.max(1, labels.length);
  labels.forEach((label, i) => {
    const v = values[i];
    const x = L + i * slot + slot * 0.15;
    const color = SERIES_COLORS[i % SERIES_COLORS.length];
    if (typeof v === "number") {
      const bar = svg("rect", { x, y: py(Math.max(0, Math.min(1, v))), width: slot * 0.7,
        height: py(0) - py(Math.max(0, Math.min(1, v))), fill: color, class: "bar",
        "data-label": label, "data-value": String(v) });
      bar.append(svg("title", {}, `${label}: ${fmt(v, 3)}`));
      root.append(bar);
      root.append(svg("text", { x: x + slot * 0.35, y: py(v) - 4, "text-anchor": "middle",
        class: "tick" }, fmt(v, 3)));
    }
    root.append(svg("text", { x: x + slot * 0.35, y: H - B + 18, "text-anchor": "middle",
      class: "tick" }, label));
  });
  return root;
}

function runTable(rows, columns) {
  const head = el("tr", {}, ...columns.map(([, title]) => el("th", {}, title)));
  const body = el("tbody", {});
  for (const r of rows) {
    body.append(el("tr", {}, ...columns.map(([key, , digits]) => {
      const v = r[key];
      if (typeof v === "number" && digits !== undefined) return numCell(v, digits);
      return el("td", {}, v === null || v === undefined ? "–" : String(v));
    })));
  }
  return el("table", { class: "grid run-table" }, el("thead", {}, head), body);
}

async function openRun(id) {
  const run = await api("/runs/detail?id=" + encodeURIComponent(id));
  state.runId = id;
  for (const b of document.querySelectorAll(".run-link")) {
    b.classList.toggle("active", b.dataset.id === id);
  }
  const view = $("run-view");
  view.replaceChildren(el("h2", {}, `${run.kind === "ttrl" ? "TTRL" : "Evaluation"}: ${run.name}`));
  if (run.kind === "ttrl") {
    const xs = run.rows.map((r) => r.batch + 1);
    const series = [
      ["accuracy", "accuracy (batch)"],
      ["accuracy_vote", "majority answer"],
      ["self_accuracy", "self-judged"],
      ["reward_mean", "planner reward"],
    ].filter(([k]) => run.rows.some((r) => typeof r[k] === "number"))
      .map(([key, label]) => ({ key, label,
        values: run.rows.map((r) => (typeof r[key] === "number" ? r[key] : null)) }));
    view.append(lineChart("accuracy per batch", xs, series));
    const shown = run.rows.map((r) => Object.assign({}, r, { batch: r.batch + 1 }));
    view.append(runTable(shown, [["batch", "batch"], ["questions", "questions"],
      ["rollouts", "rollouts"], ["accuracy", "accuracy", 3], ["accuracy_vote", "vote", 3],
      ["reward_mean", "reward", 3], ["replan_rate", "replan", 2], ["memories", "memories"],
      ["seconds", "seconds", 1]]));
  } else {
    const labels = run.rows.map((r) => String(r.policy));
    view.append(barChart("accuracy per policy", labels, run.rows.map((r) => r.accuracy)));
    view.append(runTable(run.rows, [["policy", "policy"], ["questions", "n"],
      ["accuracy", "accuracy", 3], ["em", "EM", 3], ["f1", "F1", 3],
      ["tool_calls_per_question", "tools/q", 2], ["tokens_per_question", "tokens/q", 0],
      ["replan_rate", "replan", 2], ["memories_written", "memories"], ["errors", "errors"]]));
  }
  view.dataset.id = id;
  view.dataset.state = "ready";
}

// ------------------------------------------------------------------------------------ start

function start() {
  for (const b of document.querySelectorAll("nav .tab")) {
    b.addEventListener("click", () => showTab(b.dataset.tab));
  }
  const cat = $("preview-category");
  for (const c of CATEGORIES) cat.append(el("option", { value: c }, c));
  $("store-filters").addEventListener("submit", (e) => { e.preventDefault(); reloadStore(true); });
  let timer = null;
  $("search").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => reloadStore(true), 300);
  });
  for (const id of ["filter-judgement", "filter-bucket", "sort", "page-size"]) {
    $(id).addEventListener("change", () => reloadStore(true));
  }
  $("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - Number($("page-size").value));
    reloadStore(false);
  });
  $("next").addEventListener("click", () => {
    state.offset += Number($("page-size").value);
    reloadStore(false);
  });
  $("detail-close").addEventListener("click", () => { $("detail").hidden = true; });
  $("preview-form").addEventListener("submit", (e) => {
    e.preventDefault();
    runPreview().catch(showError);
  });
  loadStats().catch(showError);
  reloadStore(true);
}

document.addEventListener("DOMContentLoaded", start);
