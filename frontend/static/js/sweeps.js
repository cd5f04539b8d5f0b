// Collective sweep charts: busbw against message size per op and algorithm, several sweeps
// overlaid (one dash style per sweep), and the memory-copy bandwidth of each as a reference.
import { api } from "./api.js";
import { PALETTE, emptyChart, layout, plot } from "./charts.js";
import { bandwidthAxes } from "./comm.js";
import { esc, fmtBytes } from "./dom.js";
import { fmt, logAxis } from "./units.js";

// metric -> [scale to base units, unit]: busbw in GB/s is drawn in B/s, time in µs in s
const METRICS = { busbw_GBps: [1e9, "B/s"], algbw_GBps: [1e9, "B/s"], time_us_mean: [1e-6, "s"] };

const DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];

export function sweepChartTraces(sweeps, metric = "busbw_GBps") {
  const traces = [];
  const colorOf = new Map();
  sweeps.forEach((s, si) => {
    const groups = new Map();
    for (const r of s.results || []) {
      const key = `${r.op} / ${r.algorithm}`;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(r);
    }
    for (const [key, pts] of groups) {
      if (!colorOf.has(key)) colorOf.set(key, PALETTE[colorOf.size % PALETTE.length]);
      pts.sort((a, b) => a.bytes - b.bytes);
      const label = `${key} — ${s.name} (${s.id})`;
      const [scale, unit] = METRICS[metric];
      traces.push({ type: "scatter", mode: "lines+markers", name: esc(label),
        x: pts.map((p) => p.bytes), y: pts.map((p) => p[metric] * scale),
        line: { color: colorOf.get(key), dash: DASHES[si % DASHES.length] },
        marker: { symbol: pts.map((p) => (p.correct === false ? "x" : "circle")) },
        text: pts.map((p) => `${esc(label)}<br>${fmtBytes(p.bytes)}: ${fmt(p[metric] * scale, unit)}` +
          (p.correct === false ? " (incorrect result)" : "")),
        hovertemplate: "%{text}<extra></extra>" });
    }
  });
  return traces;
}

export async function mountSweepChart(div, ids, timeDiv = null) {
  let sweeps;
  try { sweeps = await api.collectiveSweeps(ids); } catch (e) { emptyChart(div, e.message); return []; }
  sweeps = sweeps.filter((s) => s.results?.length);
  if (!sweeps.length) { emptyChart(div, "no sweep results"); return []; }
  const shapes = sweeps.filter((s) => s.copy_bandwidth_GBps).map((s, i) => ({
    type: "line", xref: "paper", x0: 0, x1: 1, y0: s.copy_bandwidth_GBps * 1e9,
    y1: s.copy_bandwidth_GBps * 1e9,
    line: { color: "#b00020", width: 1, dash: DASHES[i % DASHES.length] } }));
  const bw = sweepChartTraces(sweeps);
  await plot(div, bw, layout("Bus bandwidth vs message size (red: memory-copy bandwidth)",
    "message size", "busbw", { ...bandwidthAxes(bw), shapes,
      legend: { orientation: "h", y: -0.25, yanchor: "top" },
      margin: { l: 70, r: 10, t: 45, b: 60 } }));
  div.dataset.sweeps = String(sweeps.length);
  if (timeDiv) {
    const tt = sweepChartTraces(sweeps, "time_us_mean");
    const ax = bandwidthAxes(tt);
    const ys = tt.flatMap((t) => t.y).filter((v) => v > 0);
    await plot(timeDiv, tt, layout("Time per operation vs message size", "message size",
      "mean time", { xaxis: ax.xaxis,
        yaxis: logAxis(Math.min(...ys), Math.max(...ys), "s"),
        legend: { orientation: "h", y: -0.25, yanchor: "top" },
        margin: { l: 70, r: 10, t: 45, b: 60 } }));
  }
  return sweeps;
}
