// The timeline: per rank a labelled lane for its compute (nested spans drawn thinner, like
// Perfetto), one for its grad_sync / wait_grads phases and one per communication axis (dp, tp,
// pp send / recv), idle gaps shaded on the compute lane, and under pipeline runs the schedule
// the analysis simulates. Every category has a colour no other category shares (CATEGORIES);
// segments the server merged for the level of detail are drawn as "many spans", never in the
// colour of one. Search highlights spans by name; a click shows the span's details. Line
// segments (scatter, or scattergl when many: lineType) draw it; zooming asks the server again
// for the finer window.
import { stepsLabel } from "./analysis.js";
import { api } from "./api.js";
import { Plotly } from "./charts.js";
import { $, el, esc, fmtPct } from "./dom.js";
import { axisUnit, fmt } from "./units.js";

// category -> colour; each colour used once (the legend and the tests rely on it)
export const CATEGORIES = {
  forward: "#4e79a7", backward: "#f28e2b", "backward (input)": "#ffbe7d",
  "backward (weight)": "#b6992d", "forward.layer": "#a0cbe8", "backward.layer": "#d4a6c8",
  optimizer: "#59a14f", "other compute": "#9aa3b2", grad_sync: "#79706e", wait_grads: "#d7b5a6",
  all_reduce: "#e15759", reduce_scatter: "#76b7b2", all_gather: "#b07aa1", broadcast: "#9c755f",
  reduce: "#ff9da7", all_to_all: "#17becf", send: "#1f3b73", recv: "#006d2c",
  "other comm": "#636363", "many spans": "#2b2b2b", idle: "#fbd3d0",
};
const DEPTH_W = [14, 8, 5, 3]; // line width by nesting depth in a lane
const COMM_W = 8;

export function categoryOf(name, channel) {
  if (channel === "compute") return name in CATEGORIES ? name : "other compute";
  if (channel === "sync") return name in CATEGORIES ? name : "grad_sync";
  return name in CATEGORIES ? name : "other comm";
}

// WebGL pays a fixed cost per draw (a context, shaders: about 0.4 s in a browser without a
// GPU, docs/benchmarks.md) that SVG does not; SVG's cost grows with the points. Below this many
// segments and idle gaps SVG draws first; above, WebGL.
const SVG_MAX = 3000;

function lineType(data) {
  return data.returned + data.idle.t0.length <= SVG_MAX ? "scatter" : "scattergl";
}

function segmentTraces(data, query) {
  const s = data.segments;
  const lanes = data.lanes;
  const groups = new Map();
  for (let i = 0; i < s.t0.length; i++) {
    const lane = lanes[s.lane[i]];
    const name = data.keys[s.key[i]] ?? "?";
    const merged = s.n[i] > 1;
    const cat = merged ? "many spans" : categoryOf(name, lane.channel);
    const depth = lane.channel === "compute" ? s.depth[i] : 0;
    const hit = !query || name.toLowerCase().includes(query);
    const gk = `${cat}|${depth}|${hit}`;
    let g = groups.get(gk);
    if (!g) {
      g = { cat, depth, hit, x: [], y: [], custom: [],
        width: lane.channel === "compute" ? DEPTH_W[depth] : COMM_W };
      groups.set(gk, g);
    }
    const y = lane.y;
    g.x.push(s.t0[i], (s.t0[i] + s.t1[i]) / 2, s.t1[i], null);
    g.y.push(y, y, y, null);
    g.custom.push(i, i, i, null);
  }
  const seen = new Set();
  return [...groups.values()].sort((a, b) => a.depth - b.depth).map((g) => {
    const first = !seen.has(g.cat);
    seen.add(g.cat);
    return { type: lineType(data), mode: "lines", name: esc(g.cat), x: g.x, y: g.y,
      customdata: g.custom, line: { color: CATEGORIES[g.cat], width: g.width },
      opacity: g.hit ? 1 : 0.15, legendgroup: g.cat, showlegend: first,
      hovertemplate: "%{text}<extra></extra>", text: g.custom.map((i) => (i === null ? null
        : hoverText(data, i))) };
  });
}

function hoverText(data, i) {
  const s = data.segments;
  const name = esc(data.keys[s.key[i]] ?? "?");
  const dur = (s.t1[i] - s.t0[i]) / 1e3;
  return `${s.n[i] > 1 ? `${s.n[i]} spans merged (longest: ${name})` : name}` +
    `${s.mb[i] >= 0 ? ` · mb ${s.mb[i]}` : ""} · step ${s.step[i]} · rank ${s.rank[i]}<br>` +
    `${fmt(dur, "s")}${s.bytes[i] ? ` · ${fmt(s.bytes[i], "B")}` : ""}`;
}

function idleTrace(data) {
  const x = [];
  const y = [];
  const compute = new Map(data.lanes.filter((l) => l.channel === "compute").map((l) => [l.rank, l.y]));
  const d = data.idle;
  for (let i = 0; i < d.t0.length; i++) {
    const yy = compute.get(d.rank[i]) ?? 0;
    x.push(d.t0[i], d.t1[i], null);
    y.push(yy, yy, null);
  }
  return { type: lineType(data), mode: "lines", name: "idle", x, y, hoverinfo: "skip",
    line: { color: CATEGORIES.idle, width: DEPTH_W[0] + 4 }, legendgroup: "idle" };
}

const THEORY_CAT = { F: "forward", B: "backward (input)", W: "backward (weight)", BW: "backward" };

function theoryTraces(theory, base, type) {
  const groups = new Map();
  theory.rows.forEach((row, i) => {
    const y = base + i;
    for (const s of row.spans) {
      const cat = THEORY_CAT[s.kind] || "other compute";
      let g = groups.get(cat);
      if (!g) { g = { cat, x: [], y: [], text: [] }; groups.set(cat, g); }
      const t = `simulated ${s.kind}${s.mb}${s.chunk ? ` chunk ${s.chunk}` : ""} · pp${row.pp}<br>` +
        `${fmt((s.t1_ms - s.t0_ms) / 1e3, "s")}`;
      g.x.push(s.t0_ms, (s.t0_ms + s.t1_ms) / 2, s.t1_ms, null);
      g.y.push(y, y, y, null);
      g.text.push(t, t, t, null);
    }
  });
  return [...groups.values()].map((g) => ({
    type, mode: "lines", name: esc(g.cat), x: g.x, y: g.y, text: g.text,
    line: { color: CATEGORIES[g.cat], width: DEPTH_W[1] + 3 }, legendgroup: g.cat,
    showlegend: false, hovertemplate: "%{text}<extra></extra>", meta: "theory" }));
}

export class Gantt {
  constructor(div, runId, info, headline) {
    this.headline = headline || {};
    this.div = div;
    this.runId = runId;
    this.info = info;
    this.step = null;
    this.data = null;
    this.pending = null;
    this.query = "";
  }

  async load(params = {}) {
    const q = { ...params };
    if (this.step !== null) q.step = this.step;
    const data = await api.gantt(this.runId, q);
    this.data = data;
    this.render(params.t0_ms !== undefined ? [params.t0_ms, params.t1_ms] : null);
    return data;
  }

  search(query) {
    this.query = (query || "").trim().toLowerCase();
    if (this.data) this.render(this.range);
  }

  render(range) {
    const data = this.data;
    this.range = range;
    const lanes = data.lanes;
    const traces = [idleTrace(data), ...segmentTraces(data, this.query)];
    const tickvals = lanes.map((l) => l.y);
    const ticktext = lanes.map((l) => esc(l.label));
    const theory = data.theory;
    const bottom = lanes.length ? Math.max(...tickvals) : 0;
    if (theory) {
      const base = bottom + 1.5;
      traces.push(...theoryTraces(theory, base, lineType(data)));
      theory.rows.forEach((r, i) => { tickvals.push(base + i); ticktext.push(esc(`simulated pp${r.pp}`)); });
    }
    // time axis: one unit for the window (ms from the trace start, drawn in its own unit)
    const w = data.window;
    this.exportLink(range || [w.t0_ms, w.t1_ms]);
    const u = axisUnit([(w.t1_ms - w.t0_ms) / 1e3], "s");
    this.msPerUnit = u.div * 1e3;
    for (const t of traces) t.x = t.x.map((v) => (v === null ? null : v / this.msPerUnit));
    const height = Math.max(340, Math.min(1100, 26 * tickvals.length + 150));
    const layout = {
      title: { text: `Timeline per rank and lane${this.step !== null ? ` — step ${this.step}` : ""}`,
        font: { size: 15 } },
      height, margin: { l: 170, r: 10, t: 70, b: 50 }, hovermode: "closest",
      xaxis: { title: { text: u.title("time since trace start") }, zeroline: false,
        range: (range || [w.t0_ms, w.t1_ms]).map((v) => v / this.msPerUnit) },
      yaxis: { tickvals, ticktext, zeroline: false, fixedrange: true,
        range: [Math.max(...tickvals, 0) + 0.8, -0.8], tickfont: { size: 11 } },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 11 },
        itemsizing: "constant" },
      shapes: theory ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: bottom + 0.75,
        y1: bottom + 0.75, line: { color: "#99a", dash: "dot", width: 1 } }] : [],
      uirevision: `${this.runId}-${this.step}`,
    };
    this.div.style.height = `${height}px`;
    const t0 = performance.now();
    return Plotly.react(this.div, traces, layout, { responsive: true, displaylogo: false })
      .then(() => {
        const d = this.div.dataset;
        d.rows = String(data.rows.length);
        d.lanes = String(lanes.length);
        d.theoryRows = String(theory ? theory.rows.length : 0);
        d.totalSpans = String(data.total_spans);
        d.segments = String(data.returned);
        d.ready = "1";
        d.simulatedBubble = theory ? String(theory.bubble_fraction) : "";
        this.info.textContent = `${data.total_spans.toLocaleString()} spans in view, ` +
          `${data.returned.toLocaleString()} drawn` +
          (data.lod.merged ? ` (merged below ${fmt(data.lod.bucket_ms / 1e3, "s")})` : "") +
          (theory ? ` · bubble: measured ${fmtPct(this.headline?.bubble_fraction, true)}, ` +
            `simulated ${fmtPct(theory.bubble_fraction, true)} (${stepsLabel(this.headline)}` +
            " stage times)" : "") +
          ` · ${Math.round(performance.now() - t0)} ms to draw`;
        if (!this.bound) this.bindEvents();
      });
  }

  // the Perfetto export of the window on view (GET /api/runs/{id}/export?t0_ms=&t1_ms=)
  exportLink([a, b]) {
    const link = document.getElementById("gantt-export");
    if (!link || !(b > a)) return;
    const q = new URLSearchParams({ format: "perfetto", t0_ms: String(Math.max(0, a)),
      t1_ms: String(b) });
    link.href = `/api/runs/${encodeURIComponent(this.runId)}/export?${q}`;
    link.dataset.t0Ms = String(Math.max(0, a));
    link.dataset.t1Ms = String(b);
  }

  details(i) {
    const data = this.data;
    const s = data.segments;
    const lane = data.lanes[s.lane[i]];
    const rows = [["name", data.keys[s.key[i]] ?? "?"], ["rank", `${s.rank[i]} · ${lane.channel}`],
      ["step", s.step[i]], ["micro-batch", s.mb[i] >= 0 ? s.mb[i] : "–"],
      ["start", `${fmt(s.t0[i] / 1e3, "s")} after the trace start`],
      ["duration", fmt((s.t1[i] - s.t0[i]) / 1e3, "s")],
      ["bytes", s.bytes[i] ? fmt(s.bytes[i], "B") : "–"],
      ["spans", s.n[i] > 1 ? `${s.n[i]} merged at this zoom: zoom in to see them` : "1"]];
    const box = $("#gantt-detail");
    if (!box) return;
    box.replaceChildren(el("table", { class: "data compact" }, el("tbody", {}, ...rows.map(
      ([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: String(v) }))))));
    box.hidden = false;
    box.dataset.segment = String(i);
  }

  bindEvents() {
    this.bound = true;
    this.div.on("plotly_click", (ev) => {
      const p = ev.points?.[0];
      if (p && p.customdata !== undefined && p.customdata !== null) this.details(p.customdata);
    });
    this.div.on("plotly_relayout", (ev) => {
      const a = ev["xaxis.range[0]"] ?? ev["xaxis.range"]?.[0];
      const b = ev["xaxis.range[1]"] ?? ev["xaxis.range"]?.[1];
      if (ev["xaxis.autorange"] && this.zoomed) {
        this.zoomed = false;
        this.load();
        return;
      }
      if (a === undefined || b === undefined || !(this.data?.lod.merged || this.zoomed)) return;
      this.zoomed = true;
      clearTimeout(this.pending);
      const k = this.msPerUnit;
      this.pending = setTimeout(() => this.load({ t0_ms: a * k, t1_ms: b * k }), 200);
    });
  }
}

function fillSteps(sel, list, current) {
  sel.replaceChildren(el("option", { value: "", text: "all steps" }),
    ...list.map((s) => el("option", { value: String(s), text: `step ${s}` })));
  sel.value = current === null ? "" : String(current);
}

// Pipeline runs open on one steady step (with the simulated schedule under it); the others on
// the whole run, in one request.
export async function mountGantt(runId, pipeline = false, headline = {}) {
  const div = $("#gantt");
  const g = new Gantt(div, runId, $("#gantt-info"), headline);
  const sel = $("#gantt-step");
  try {
    if (pipeline) {
      const list = (await api.ganttSteps(runId)).steps.map((s) => s.step);
      if (list.length) g.step = list[Math.min(list.length - 1, Math.floor(list.length / 2))];
      fillSteps(sel, list, g.step);
      await g.load();
    } else {
      const data = await g.load();
      // a large run opens on one step (backend/gantt_columnar.py): select the one shown
      const shown = data.lod?.shown_step;
      if (shown !== undefined && shown !== null) g.step = shown;
      fillSteps(sel, data.steps.map((s) => s.step), g.step);
    }
  } catch (e) {
    div.classList.add("empty");
    div.textContent = e.status === 404 ? "no trace for this run (yet)" : e.message;
    return null;
  }
  sel.addEventListener("change", () => {
    g.step = sel.value === "" ? null : Number(sel.value);
    g.zoomed = false;
    g.load();
  });
  $("#gantt-reset").addEventListener("click", () => { g.zoomed = false; g.load(); });
  const search = $("#gantt-search");
  if (search) search.addEventListener("input", () => g.search(search.value));
  return g;
}
