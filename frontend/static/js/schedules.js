// The pipeline schedule explorer (/schedules): a small form whose every edit (debounced) asks
// GET /api/schedules/explore for the simulated schedule, drawn as a Gantt (one row per pipeline
// rank, bars coloured by action kind, idle time left white), with bubble cards and the action
// lists. A 422 is shown next to the field its `loc` names. The URL is the shareable view.
import { api } from "./api.js";
import { PALETTE, layout, plot } from "./charts.js";
import { $, el, esc, fmtNum, fmtPct } from "./dom.js";

const FIELDS = ["schedule", "p", "m", "v", "t_f", "t_b_input", "t_b_weight", "t_comm"];
const KIND_COLORS = { F: PALETTE[0], B: PALETTE[1], W: PALETTE[2], BW: PALETTE[3] };
const KIND_NAMES = { F: "F (forward)", B: "B (input grad)", W: "W (weight grad)",
  BW: "BW (full backward)" };
const BAR_LIMIT = 8000; // above this many spans, WebGL line segments instead of SVG bars
let info = null;
let timer = null;
let seq = 0;

const control = (name) => $(`#s-${name}`);

function card(label, value, sub) {
  return el("div", { class: "card", dataset: { card: label } },
    el("div", { class: "label", text: label }), el("div", { class: "value", text: value }),
    sub ? el("div", { class: "sub", text: sub }) : null);
}

const fmtCount = (x) => (Number.isInteger(x) ? String(x) : fmtNum(x, 1));

function readParams() {
  const out = {};
  for (const f of FIELDS) out[f] = control(f).value.trim();
  return out;
}

function showErrors(errors) {
  for (const f of document.querySelectorAll("#sched-form .field")) {
    f.classList.remove("invalid");
    f.querySelector(".msg").textContent = "";
  }
  const general = [];
  for (const e of errors) {
    const name = (e.loc || []).filter((x) => x !== "query").join(".");
    const field = document.querySelector(`#sched-form .field[data-field="${CSS.escape(name)}"]`);
    if (field) {
      field.classList.add("invalid");
      const msg = field.querySelector(".msg");
      msg.textContent += (msg.textContent ? "\n" : "") + e.msg;
    } else {
      general.push(`${name || "request"}: ${e.msg}`);
    }
  }
  $("#sched-error").textContent = general.join("\n");
}

function cards(d) {
  const closed = d.closed_form;
  const none = d.split_backward ? `no closed form (${d.schedule})`
    : "no closed form with t_comm > 0";
  const peaks = d.ranks.map((r) => r.peak_inflight_microbatches);
  $("#sched-cards").replaceChildren(
    card("bubble fraction", fmtPct(d.bubble_fraction, true), closed
      ? `closed form ${closed.formula_total} = ${fmtPct(closed.total, true)}` : none),
    card("bubble over ideal", fmtPct(d.bubble_over_ideal, true), closed
      ? `closed form ${closed.formula_ideal} = ${fmtPct(closed.ideal, true)}` : none),
    card("makespan", `${fmtNum(d.makespan_s, 2)} t`, "in units of t (relative stage costs)"),
    card("peak in-flight micro-batches", fmtCount(Math.max(...peaks)), peaks.length <= 8
      ? `per rank: ${peaks.map(fmtCount).join(" · ")}`
      : `min ${fmtCount(Math.min(...peaks))} over ${peaks.length} ranks`));
}

function spanLabel(s, v) {
  return v > 1 ? `${s.mb}c${s.chunk}` : String(s.mb);
}

function hover(s, rank, v) {
  return esc(`${s.kind}${s.mb}${v > 1 ? ` chunk ${s.chunk}` : ""} · stage ${s.stage} · ` +
    `rank ${rank}`) + `<br>${fmtNum(s.start, 3)} → ${fmtNum(s.end, 3)} t`;
}

// One trace per kind: horizontal bars (base = start, x = duration) with the micro-batch as text.
function barTraces(d) {
  const groups = new Map();
  for (const r of d.ranks) {
    for (const s of r.spans) {
      let g = groups.get(s.kind);
      if (!g) { g = { x: [], base: [], y: [], text: [], hover: [] }; groups.set(s.kind, g); }
      g.x.push(s.end - s.start);
      g.base.push(s.start);
      g.y.push(r.rank);
      g.text.push(esc(spanLabel(s, d.v)));
      g.hover.push(hover(s, r.rank, d.v));
    }
  }
  return Object.keys(KIND_COLORS).filter((k) => groups.has(k)).map((k) => {
    const g = groups.get(k);
    return { type: "bar", orientation: "h", name: esc(KIND_NAMES[k]), x: g.x, base: g.base,
      y: g.y, text: g.text, customdata: g.hover, textposition: "inside",
      insidetextanchor: "middle", textfont: { color: "#fff", size: 11 }, width: 0.8,
      marker: { color: KIND_COLORS[k], line: { color: "#fff", width: 1 } },
      hovertemplate: "%{customdata}<extra></extra>" };
  });
}

// Large schedules: WebGL line segments (as the run page's Gantt), no bar text.
function lineTraces(d) {
  const groups = new Map();
  for (const r of d.ranks) {
    for (const s of r.spans) {
      let g = groups.get(s.kind);
      if (!g) { g = { x: [], y: [], text: [] }; groups.set(s.kind, g); }
      const t = hover(s, r.rank, d.v);
      g.x.push(s.start, (s.start + s.end) / 2, s.end, null);
      g.y.push(r.rank, r.rank, r.rank, null);
      g.text.push(t, t, t, null);
    }
  }
  const width = Math.max(3, Math.min(18, 240 / d.p));
  return Object.keys(KIND_COLORS).filter((k) => groups.has(k)).map((k) => {
    const g = groups.get(k);
    return { type: "scattergl", mode: "lines", name: esc(KIND_NAMES[k]), x: g.x, y: g.y,
      text: g.text, line: { color: KIND_COLORS[k], width },
      hovertemplate: "%{text}<extra></extra>" };
  });
}

async function gantt(d) {
  const div = $("#sched-gantt");
  const nSpans = d.ranks.reduce((n, r) => n + r.spans.length, 0);
  const traces = nSpans > BAR_LIMIT ? lineTraces(d) : barTraces(d);
  const ranks = d.ranks.map((r) => r.rank);
  const height = Math.max(260, Math.min(1400, 34 * d.p + 170));
  div.style.height = `${height}px`;
  const title = `${d.schedule} · p=${d.p} m=${d.m} v=${d.v} (${d.placement} placement)`;
  await plot(div, traces, layout(esc(title), "time (units of t)", "pipeline rank", {
    height, barmode: "overlay", plot_bgcolor: "#fff",
    uniformtext: { mode: "hide", minsize: 8 },
    margin: { l: 80, r: 20, t: 70, b: 50 },
    legend: { y: 1.01, yanchor: "bottom", x: 1, xanchor: "right" },
    xaxis: { range: [0, d.makespan_s || 1], zeroline: false, showgrid: false },
    yaxis: { tickvals: ranks, ticktext: d.ranks.map((r) => esc(`rank ${r.rank}`)),
      range: [d.p - 0.5, -0.5], showgrid: false, zeroline: false },
  }));
  div.dataset.rows = String(new Set(traces.flatMap((t) => t.y.filter((y) => y !== null))).size);
  div.dataset.spans = String(nSpans);
}

function actionsTable(d) {
  $("#sched-actions").replaceChildren(
    el("thead", {}, el("tr", {}, el("th", { text: "rank" }), el("th", { text: "stages" }),
      el("th", { class: "num", text: "idle" }), el("th", { text: "actions, in order" }))),
    el("tbody", {}, ...d.ranks.map((r, i) => el("tr", { dataset: { rank: String(r.rank) } },
      el("td", { text: String(r.rank) }), el("td", { text: r.stages.join(", ") }),
      el("td", { class: "num", text: fmtPct(r.idle_fraction, true) }),
      el("td", { text: (d.actions[i] || []).join(" ") })))));
}

async function run() {
  const mine = ++seq;
  const params = readParams();
  history.replaceState(null, "", `/schedules?${new URLSearchParams(params)}`);
  let d;
  try {
    d = await api.exploreSchedule(params);
  } catch (e) {
    if (mine !== seq) return;
    $("#sched-results").classList.add("stale");
    if (e.status === 422 && Array.isArray(e.detail)) {
      showErrors(e.detail);
      $("#sched-status").textContent = "fix the highlighted field";
    } else {
      showErrors([]);
      $("#sched-error").textContent = e.message;
      $("#sched-status").textContent = "";
    }
    return;
  }
  if (mine !== seq) return;
  showErrors([]);
  $("#sched-results").classList.remove("stale");
  $("#sched-status").textContent = "";
  cards(d);
  $("#sched-convention").textContent = d.convention;
  actionsTable(d);
  await gantt(d);
}

function schedule() {
  clearTimeout(timer);
  $("#sched-status").textContent = "updating…";
  timer = setTimeout(run, 250);
}

async function init() {
  try {
    info = await api.schedules();
  } catch (e) {
    $("#sched-error").textContent = e.message;
    return;
  }
  control("schedule").replaceChildren(...info.schedules.map((s) =>
    el("option", { value: s, text: info.placements[s] === "v" ? `${s} (V placement)` : s })));
  const url = new URLSearchParams(location.search);
  for (const f of FIELDS) {
    let value = url.get(f) ?? info.defaults[f];
    if (f === "schedule" && !info.schedules.includes(value)) value = info.defaults.schedule;
    if (value !== undefined && value !== null) control(f).value = String(value);
  }
  for (const f of ["p", "m", "v"]) {
    control(f).min = info.limits[f].min;
    control(f).max = info.limits[f].max;
  }
  $("#sched-form").addEventListener("input", schedule);
  $("#sched-form").addEventListener("change", schedule);
  $("#sched-form").addEventListener("submit", (ev) => { ev.preventDefault(); schedule(); });
  await run();
}

init();
