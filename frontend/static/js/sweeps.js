// Collective sweep charts: busbw against message size per op and algorithm, several sweeps
// overlaid (one dash style per sweep), and the memory-copy bandwidth of each as a reference.
import { api } from "./api.js";
import { PALETTE, emptyChart, layout, plot } from "./charts.js";
import { esc } from "./dom.js";

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
      traces.push({ type: "scatter", mode: "lines+markers", name: esc(label),
        x: pts.map((p) => p.bytes), y: pts.map((p) => p[metric]),
        line: { color: colorOf.get(key), dash: DASHES[si % DASHES.length] },
        marker: { symbol: pts.map((p) => (p.correct === false ? "x" : "circle")) },
        hovertemplate: `${esc(label)}<br>%{x} B: %{y:.4g}<extra></extra>` });
    }
  });
  return traces;
}

export async function mountSweepChart(div, ids, timeDiv = null) {
  let sweeps;
  try { sweeps = await api.sweeps(ids); } catch (e) { emptyChart(div, e.message); return []; }
  sweeps = sweeps.filter((s) => s.results?.length);
  if (!sweeps.length) { emptyChart(div, "no sweep results"); return []; }
  const shapes = sweeps.filter((s) => s.copy_bandwidth_GBps).map((s, i) => ({
    type: "line", xref: "paper", x0: 0, x1: 1, y0: s.copy_bandwidth_GBps, y1: s.copy_bandwidth_GBps,
    line: { color: "#b00020", width: 1, dash: DASHES[i % DASHES.length] } }));
  await plot(div, sweepChartTraces(sweeps), layout("Bus bandwidth vs message size",
    "message size (bytes)", "busbw (GB/s)", { xaxis: { type: "log" }, yaxis: { type: "log" },
      shapes, legend: { orientation: "v", x: 1.02, y: 1, yanchor: "top" },
      margin: { l: 70, r: 10, t: 45, b: 60 } }));
  div.dataset.sweeps = String(sweeps.length);
  if (timeDiv) {
    await plot(timeDiv, sweepChartTraces(sweeps, "time_us_mean"), layout(
      "Time per operation vs message size", "message size (bytes)", "mean time (µs)",
      { xaxis: { type: "log" }, yaxis: { type: "log" },
        legend: { orientation: "v", x: 1.02, y: 1, yanchor: "top" },
        margin: { l: 70, r: 10, t: 45, b: 60 } }));
  }
  return sweeps;
}
