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
import { idleTrace, lineType, segmentTraces, theoryTraces } from "./gantt_traces.js";
import { axisUnit, fmt } from "./units.js";

export { CATEGORIES, categoryOf } from "./gantt_traces.js";

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

  // The header's measured bubble is the headline's bubble_fraction, the figure the bubble card
  // shows: the run page hands every new analysis (live refreshes, the final one) to both, so
  // the two never disagree until a reload.
  setHeadline(headline) {
    this.headline = headline || {};
    if (this.data) this.renderInfo();
  }

  renderInfo() {
    const data = this.data;
    const theory = data.theory;
    const h = this.headline;
    this.div.dataset.measuredBubble = h?.bubble_fraction === null || h?.bubble_fraction ===
      undefined ? "" : String(h.bubble_fraction);
    this.info.textContent = `${fmt(data.total_spans, "", { trim: true })} spans in view, ` +
      `${fmt(data.returned, "", { trim: true })} drawn` +
      (data.lod.merged ? ` (merged below ${fmt(data.lod.bucket_ms / 1e3, "s")})` : "") +
      (theory ? ` · bubble: measured ${fmtPct(h?.bubble_fraction, true)}, ` +
        `simulated ${fmtPct(theory.bubble_fraction, true)} (${stepsLabel(h)}` +
        " stage times)" : "") +
      ` · ${fmt(this.drawS, "s")} to draw`;
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
    // time axis: ms from the trace start, drawn in the unit of the largest time on view (a
    // window at 49.3 s reads "49.3 s", never "49.3k ms"); no SI suffix on the ticks
    const w = data.window;
    const view = range || [w.t0_ms, w.t1_ms];
    this.exportLink(view);
    const u = axisUnit([Math.max(Math.abs(view[0]), Math.abs(view[1])) / 1e3], "s");
    this.msPerUnit = u.div * 1e3;
    for (const t of traces) t.x = t.x.map((v) => (v === null ? null : v / this.msPerUnit));
    const height = Math.max(340, Math.min(1100, 26 * tickvals.length + 150));
    // the title at the figure's top, the legend between it and the plot: the top margin grows
    // with the legend's rows (about 130 px an entry), so the legend never covers the title
    const entries = traces.filter((t) => t.showlegend !== false).length;
    const perRow = Math.max(1, Math.floor(((this.div.clientWidth || 1000) - 20) / 130));
    const top = 38 + 22 * Math.ceil(entries / perRow);
    const layout = {
      title: { text: `Timeline per rank and lane${this.step !== null ? ` — step ${this.step}` : ""}`,
        font: { size: 15 }, yref: "container", y: 1, yanchor: "top", pad: { t: 8 } },
      height, margin: { l: 170, r: 10, t: top, b: 50 }, hovermode: "closest",
      xaxis: { title: { text: u.title("time since trace start") }, zeroline: false,
        exponentformat: "none",
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
        this.drawS = (performance.now() - t0) / 1e3;
        this.renderInfo();
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
      // a large run opens on one step (backend/services/gantt_columnar.py): select the one shown
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
