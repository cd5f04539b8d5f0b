// Communication: bytes per mesh axis, per-collective busbw against message size next to the
// latest sweep, and per-rank overlap / exposed communication with stragglers highlighted.
import { api, rowsOf } from "./api.js";
import { COMPONENT_COLORS, PALETTE, emptyChart, layout, plot } from "./charts.js";
import { $, esc } from "./dom.js";

export function busbwTraces(collectives, prefix = "", dash = "solid") {
  const groups = new Map();
  for (const c of collectives) {
    const key = `${c.op} (${c.axis})`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(c);
  }
  return [...groups.entries()].map(([key, pts], i) => {
    pts.sort((a, b) => a.bytes - b.bytes);
    return { type: "scatter", mode: "lines+markers", name: esc(prefix + key),
      x: pts.map((p) => p.bytes), y: pts.map((p) => p.busbw_GBps),
      line: { dash, color: PALETTE[i % PALETTE.length] },
      text: pts.map((p) => `${esc(prefix + key)}<br>${p.count ?? ""} calls, mean ` +
        `${(p.time_us_mean ?? 0).toFixed(1)} µs`),
      hovertemplate: "%{text}<br>%{x} B → %{y:.4g} GB/s<extra></extra>" };
  });
}

export function sweepTraces(sweep, ops) {
  if (!sweep) return [];
  const groups = new Map();
  for (const r of sweep.results) {
    if (ops && !ops.has(r.op)) continue;
    const key = `${r.op}/${r.algorithm}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(r);
  }
  return [...groups.entries()].map(([key, pts]) => ({
    type: "scatter", mode: "lines", name: esc(`sweep ${sweep.id}: ${key}`),
    x: pts.map((p) => p.bytes), y: pts.map((p) => p.busbw_GBps),
    line: { dash: "dot", color: "#888" },
    hovertemplate: `${esc(key)} (sweep)<br>%{x} B → %{y:.4g} GB/s<extra></extra>` }));
}

export async function mountComm(runId) {
  let data;
  try { data = await api.comm(runId); } catch (e) { emptyChart($("#comm-axis"), e.message); return null; }
  if (!data) { emptyChart($("#comm-axis"), "no trace for this run"); return null; }
  const ranks = [...new Set(data.axis_bytes.map((r) => r.rank))].sort((a, b) => a - b);
  const axes = [...new Set(data.axis_bytes.map((r) => r.axis))];
  if (axes.length) {
    await plot($("#comm-axis"), axes.map((ax, i) => ({
      type: "bar", name: esc(ax), x: ranks.map((r) => `rank ${r}`), marker: { color: PALETTE[i] },
      y: ranks.map((r) => (data.axis_bytes.find((x) => x.rank === r && x.axis === ax)
        ?.bytes_sent ?? 0) / 1e6),
      hovertemplate: `${esc(ax)} %{x}: %{y:.4g} MB<extra></extra>` })),
    layout("Bytes sent per mesh axis (whole run)", "rank", "MB sent", { barmode: "group" }));
  } else emptyChart($("#comm-axis"), "no communication in this run");
  const ops = new Set(data.collectives.map((c) => c.op));
  const bw = [...busbwTraces(data.collectives), ...sweepTraces(data.sweep, ops)];
  if (bw.length) {
    await plot($("#comm-busbw"), bw, layout("Bus bandwidth per collective vs message size",
      "message size (bytes)", "busbw (GB/s)", { xaxis: { type: "log" }, yaxis: { type: "log" } }));
  } else emptyChart($("#comm-busbw"), "no collectives");
  await markStragglers(runId, data.ranks);
  if (data.ranks.length) await overlapChart($("#comm-overlap"), data.ranks);
  return data;
}

// The analysis' per-step stragglers (the rank the others waited for longest), when present,
// replace the compute-time heuristic: a straggler is last in at least half of the steps.
async function markStragglers(runId, ranks) {
  let rows = [];
  try { rows = rowsOf((await api.metrics(runId))?.tables?.stragglers); } catch { rows = []; }
  rows = rows.filter((r) => r.rank !== undefined && r.rank !== null);
  if (!rows.length || ranks.length < 2) return;
  const count = new Map();
  for (const r of rows) count.set(r.rank, (count.get(r.rank) || 0) + 1);
  for (const r of ranks) r.straggler = (count.get(r.rank) || 0) >= rows.length / 2;
}

async function overlapChart(div, ranks) {
  const x = ranks.map((r) => `rank ${r.rank}${r.straggler ? " ⚠ straggler" : ""}`);
  const part = (key, name, color) => ({ type: "bar", name, x, y: ranks.map((r) => r[key] * 1e3),
    marker: { color, line: { color: ranks.map((r) => (r.straggler ? "#b00020" : color)),
      width: ranks.map((r) => (r.straggler ? 3 : 0)) } },
    hovertemplate: `${name} %{x}: %{y:.3f} ms<extra></extra>` });
  const overlapped = ranks.map((r) => (r.comm_s - r.exposed_comm_s) * 1e3);
  const traces = [part("compute_s", "compute", "#4e79a7"),
    part("exposed_comm_s", "exposed comm", "#e15759"),
    part("bubble_s", "bubble", "#edc948"), part("idle_s", "idle", "#bab0ac"),
    { type: "scatter", mode: "markers+text", name: "comm overlapped with compute", x,
      y: overlapped, marker: { color: COMPONENT_COLORS.optim, size: 10, symbol: "diamond" },
      text: ranks.map((r) => (r.overlap_pct === null ? "" : `${r.overlap_pct.toFixed(0)} %`)),
      textposition: "top center", hovertemplate: "overlapped %{x}: %{y:.3f} ms<extra></extra>" }];
  await plot(div, traces, layout("Time per rank over all steps: compute, exposed comm, bubble, " +
    "idle (◆ overlapped comm, % overlap)", "rank", "time (ms)", { barmode: "stack" }));
  div.dataset.stragglers = String(ranks.filter((r) => r.straggler).length);
}
