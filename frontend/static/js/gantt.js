// The Gantt: one row per rank (grouped by mesh coordinates), compute spans coloured by
// micro-batch, communication by collective, idle gaps shaded, the theoretical pipeline schedule
// under the measured one. WebGL line segments (scattergl) draw it; the server bounds what it
// sends (level of detail), and zooming asks it again for the finer window.
import { api } from "./api.js";
import { PALETTE, Plotly } from "./charts.js";
import { stepsLabel } from "./analysis.js";
import { $, el, esc, fmtPct } from "./dom.js";

const COMM_COLORS = ["#1f3b73", "#8c2d04", "#006d2c", "#54278f", "#a50f15", "#08519c",
  "#7f2704", "#252525"];
const LANE_DY = [0, -0.3, 0.3]; // compute, comm ops (above), sync / wait phases (below)
const LANE_W = [13, 5, 5];
const IDLE = "rgba(225, 87, 89, 0.28)";

function alpha(hex, a) {
  const n = Number.parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

function groupKey(lane, name, mb) {
  if (lane === 0 && (name.startsWith("forward") || name.startsWith("backward"))) {
    return `${name}|${mb < 0 ? 0 : mb % PALETTE.length}`;
  }
  return name;
}

function styleOf(lane, name, mbSlot, commIndex) {
  if (lane === 0 && name.startsWith("forward")) return PALETTE[mbSlot];
  if (lane === 0 && name.startsWith("backward")) {
    return alpha(PALETTE[mbSlot], name.includes("weight") ? 0.35 : 0.6);
  }
  if (lane === 0) return name === "optimizer" ? "#555d6b" : "#9aa3b2";
  if (lane === 1) return COMM_COLORS[commIndex % COMM_COLORS.length];
  return "#b8a36a";
}

function segmentTraces(data, yOf) {
  const s = data.segments;
  const groups = new Map();
  const commNames = [...new Set(s.key.filter((_, i) => s.lane[i] === 1).map((k) => data.keys[k]))];
  for (let i = 0; i < s.t0.length; i++) {
    const lane = s.lane[i];
    const name = data.keys[s.key[i]] ?? "?";
    const gk = `${lane}|${groupKey(lane, name, s.mb[i])}`;
    let g = groups.get(gk);
    if (!g) {
      const slot = s.mb[i] < 0 ? 0 : s.mb[i] % PALETTE.length;
      const multiMb = lane === 0 && (name.startsWith("forward") || name.startsWith("backward"));
      g = { x: [], y: [], text: [], lane, order: lane * 1000 + (multiMb ? slot : 900),
        name: multiMb ? `${name} mb${slot}${data.maxMb >= PALETTE.length ? "+" : ""}` : name,
        color: styleOf(lane, name, slot, commNames.indexOf(name)) };
      groups.set(gk, g);
    }
    const y = yOf(s.rank[i]) + LANE_DY[lane];
    const dur = s.t1[i] - s.t0[i];
    const label = `${esc(name)}${s.mb[i] >= 0 ? ` mb${s.mb[i]}` : ""} · step ${s.step[i]}` +
      ` · rank ${s.rank[i]}<br>${dur.toFixed(3)} ms` +
      (s.n[i] > 1 ? ` · ${s.n[i]} spans merged` : "") +
      (s.bytes[i] ? ` · ${(s.bytes[i] / 1e6).toPrecision(3)} MB` : "");
    g.x.push(s.t0[i], (s.t0[i] + s.t1[i]) / 2, s.t1[i], null);
    g.y.push(y, y, y, null);
    g.text.push(label, label, label, null);
  }
  return [...groups.values()].sort((a, b) => a.order - b.order).map((g) => ({
    type: "scattergl", mode: "lines", name: esc(g.name), x: g.x, y: g.y, text: g.text,
    line: { color: g.color, width: LANE_W[g.lane] }, hovertemplate: "%{text}<extra></extra>",
    legendgroup: ["compute", "comm", "sync"][g.lane],
  }));
}

function idleTrace(data, yOf) {
  const x = [];
  const y = [];
  const d = data.idle;
  for (let i = 0; i < d.t0.length; i++) {
    const yy = yOf(d.rank[i]);
    x.push(d.t0[i], d.t1[i], null);
    y.push(yy, yy, null);
  }
  return { type: "scattergl", mode: "lines", name: "idle", x, y, hoverinfo: "skip",
    line: { color: IDLE, width: LANE_W[0] } };
}

function theoryTraces(theory, base) {
  const groups = new Map();
  theory.rows.forEach((row, i) => {
    const y = base + i;
    for (const s of row.spans) {
      const slot = s.mb % PALETTE.length;
      const key = `${s.kind}|${slot}`;
      let g = groups.get(key);
      if (!g) {
        const color = s.kind === "F" ? PALETTE[slot] : alpha(PALETTE[slot], s.kind === "W" ? 0.35 : 0.6);
        g = { x: [], y: [], text: [], color };
        groups.set(key, g);
      }
      const t = `theory ${s.kind}${s.mb}${s.chunk ? ` chunk ${s.chunk}` : ""} · pp${row.pp}<br>` +
        `${(s.t1_ms - s.t0_ms).toFixed(3)} ms`;
      g.x.push(s.t0_ms, (s.t0_ms + s.t1_ms) / 2, s.t1_ms, null);
      g.y.push(y, y, y, null);
      g.text.push(t, t, t, null);
    }
  });
  return [...groups.values()].map((g, i) => ({
    type: "scattergl", mode: "lines", name: "theory (simulated schedule)", x: g.x, y: g.y,
    text: g.text, line: { color: g.color, width: 11 }, hovertemplate: "%{text}<extra></extra>",
    legendgroup: "theory", showlegend: i === 0,
  }));
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
  }

  async load(params = {}) {
    const q = { ...params };
    if (this.step !== null) q.step = this.step;
    const data = await api.gantt(this.runId, q);
    data.maxMb = Math.max(-1, ...data.segments.mb.slice(0, 5000));
    this.data = data;
    this.render(params.t0_ms !== undefined ? [params.t0_ms, params.t1_ms] : null);
    return data;
  }

  render(range) {
    const data = this.data;
    const rows = data.rows;
    const yMap = new Map(rows.map((r) => [r.rank, r.y]));
    const yOf = (rank) => yMap.get(rank) ?? 0;
    const traces = [idleTrace(data, yOf), ...segmentTraces(data, yOf)];
    const tickvals = rows.map((r) => r.y);
    const ticktext = rows.map((r) => esc(r.label));
    const theory = data.theory;
    if (theory) {
      const base = rows.length + 0.6;
      traces.push(...theoryTraces(theory, base));
      theory.rows.forEach((r, i) => { tickvals.push(base + i); ticktext.push(esc(r.label)); });
    }
    const nRows = tickvals.length;
    const height = Math.max(340, Math.min(900, 48 * nRows + 110));
    const w = data.window;
    const layout = {
      title: { text: `Timeline per rank${this.step !== null ? ` — step ${this.step}` : ""}`,
        font: { size: 15 } },
      height, margin: { l: 150, r: 10, t: 45, b: 55 }, hovermode: "closest",
      xaxis: { title: { text: "time since trace start (ms)" }, range: range || [w.t0_ms, w.t1_ms],
        zeroline: false },
      yaxis: { tickvals, ticktext, zeroline: false, fixedrange: true,
        title: { text: "rank (mesh coordinates)" }, range: [Math.max(...tickvals) + 0.6, -0.6] },
      legend: { orientation: "v", x: 1.01, y: 1, yanchor: "top", font: { size: 11 } },
      shapes: theory ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: rows.length - 0.2,
        y1: rows.length - 0.2, line: { color: "#99a", dash: "dot", width: 1 } }] : [],
      uirevision: `${this.runId}-${this.step}`,
    };
    this.div.style.height = `${height}px`;
    const t0 = performance.now();
    return Plotly.react(this.div, traces, layout, { responsive: true, displaylogo: false })
      .then(() => {
        const d = this.div.dataset;
        d.rows = String(rows.length);
        d.theoryRows = String(theory ? theory.rows.length : 0);
        d.totalSpans = String(data.total_spans);
        d.segments = String(data.returned);
        d.ready = "1";
        d.simulatedBubble = theory ? String(theory.bubble_fraction) : "";
        this.info.textContent = `${data.total_spans.toLocaleString()} spans in view, ` +
          `${data.returned.toLocaleString()} drawn` +
          (data.lod.merged ? ` (merged below ${data.lod.bucket_ms.toPrecision(3)} ms)` : "") +
          (theory ? ` · bubble: measured ${fmtPct(this.headline?.bubble_fraction, true)}, ` +
            `simulated ${fmtPct(theory.bubble_fraction, true)} (${stepsLabel(this.headline)}` +
            " stage times)" : "") +
          ` · ${Math.round(performance.now() - t0)} ms to draw`;
        if (!this.bound) this.bindZoom();
      });
  }

  bindZoom() {
    this.bound = true;
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
      this.pending = setTimeout(() => this.load({ t0_ms: a, t1_ms: b }), 200);
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
      fillSteps(sel, data.steps.map((s) => s.step), null);
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
  return g;
}
