// Communication: bytes per mesh axis, bus bandwidth against message size next to the latest
// sweep, and the per-rank step-time breakdown with the straggler marked. Every value is a cell
// of the run's analysis tables (axis_bytes, bandwidth, ranks) or its headline.
import { table, headlineOf, rule, stepsLabel } from "./analysis.js";
import { COMPONENT_COLORS, OP_SYMBOLS, colorOf, emptyChart, layout, plot } from "./charts.js";
import { $, el, esc, fmtBytes, fmtPct, fmtSeconds } from "./dom.js";
import { axisUnit, fmt, logAxis } from "./units.js";

// log-log bandwidth axes: message size in bytes, busbw in B/s (from the tables' GB/s)
export function bandwidthAxes(traces) {
  const xs = traces.flatMap((t) => t.x).filter((v) => v > 0);
  const ys = traces.flatMap((t) => t.y).filter((v) => v > 0);
  return { xaxis: logAxis(Math.min(...xs), Math.max(...xs), "B"),
    yaxis: logAxis(Math.min(...ys), Math.max(...ys), "B/s") };
}

// `rows`: the analysis' bandwidth table (median per op, axis, size and group size)
export function busbwTraces(rows, prefix = "", dash = "solid") {
  const groups = new Map();
  for (const c of rows) {
    const key = `${c.op} (${c.axis})`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(c);
  }
  return [...groups.entries()].map(([key, pts]) => {
    pts.sort((a, b) => a.payload_bytes - b.payload_bytes);
    // colour by mesh axis, marker by op: the same on every run (charts.js AXIS_COLORS)
    return { type: "scatter", mode: "lines+markers", name: esc(prefix + key),
      x: pts.map((p) => p.payload_bytes), y: pts.map((p) => p.busbw_GBps * 1e9),
      line: { dash, color: colorOf(pts[0].axis) },
      marker: { symbol: OP_SYMBOLS[pts[0].op] || "circle" },
      text: pts.map((p) => `${esc(prefix + key)}<br>${fmtBytes(p.payload_bytes)} → ` +
        `${fmt(p.busbw_GBps * 1e9, "B/s")}<br>${p.instances} instances, median transfer ` +
        `${fmtSeconds(p.duration_median_s)}`),
      hovertemplate: "%{text}<extra></extra>" };
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
    x: pts.map((p) => p.bytes), y: pts.map((p) => p.busbw_GBps * 1e9),
    line: { dash: "dot", color: "#888" },
    text: pts.map((p) => `${esc(key)} (sweep)<br>${fmtBytes(p.bytes)} → ` +
      `${fmt(p.busbw_GBps * 1e9, "B/s")}`),
    hovertemplate: "%{text}<extra></extra>" }));
}

export async function mountComm(analysis, sweep) {
  const h = headlineOf(analysis);
  const axisRows = table(analysis, "axis_bytes");
  const ranks = [...new Set(axisRows.map((r) => r.rank))].sort((a, b) => a - b);
  const axes = [...new Set(axisRows.map((r) => r.axis))];
  if (axes.length) {
    const per = (r, ax) => axisRows.find((x) => x.rank === r && x.axis === ax)?.bytes_sent_per_step ?? 0;
    const u = axisUnit(ranks.flatMap((r) => axes.map((ax) => per(r, ax))), "B");
    await plot($("#comm-axis"), axes.map((ax) => ({
      type: "bar", name: esc(ax), x: ranks.map((r) => `rank ${r}`), marker: { color: colorOf(ax) },
      y: ranks.map((r) => per(r, ax) / u.div),
      text: ranks.map((r) => `${esc(ax)} rank ${r}: ${fmtBytes(per(r, ax))} per step`),
      textposition: "none", hovertemplate: "%{text}<extra></extra>" })),
    layout("Bytes sent per step, per mesh axis", "rank", u.title("sent per step"),
      { barmode: "group" }));
  } else emptyChart($("#comm-axis"), "no communication in this run");
  linksTable($("#comm-links"), table(analysis, "links"));
  const bwRows = table(analysis, "bandwidth");
  const ops = new Set(bwRows.map((c) => c.op));
  const bw = [...busbwTraces(bwRows), ...sweepTraces(sweep, ops)];
  if (bw.length) {
    await plot($("#comm-busbw"), bw, layout(`Bus bandwidth per collective vs message size ` +
      `(median, ${stepsLabel(h)})`, "message size", "busbw", bandwidthAxes(bw)));
  } else emptyChart($("#comm-busbw"), "no collectives");
  const rankRows = table(analysis, "ranks");
  if (rankRows.length) await overlapChart($("#comm-overlap"), rankRows, h, analysis);
}

// The links table: per mesh axis and link (intra- / inter-host, from the ranks' hosts), the
// busiest rank's bytes per step and the median busbw, next to the theory's link and time.
export function linksTable(tbl, rows) {
  if (!tbl) return;
  const num = (v, f) => el("td", { class: "num", text: v === null || v === undefined ? "–" : f(v) });
  const head = ["axis", "link", "ranks", "bytes / step (busiest rank)", "busbw (median)",
    "instances", "predicted link", "predicted bytes", "predicted busbw", "predicted time"];
  tbl.replaceChildren(el("caption", { class: "muted small", text: rows.length
    ? `Per link; hosts: ${rows[0].hosts_source}` : "Per link: no communication" }),
  el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
  el("tbody", {}, ...rows.map((r) => el("tr", { dataset: { axis: r.axis, link: r.link },
    title: r.predicted_bandwidth_source ? `predicted busbw: ${r.predicted_bandwidth_source}` : null },
    el("td", { text: r.axis }), el("td", { text: r.link }), num(r.ranks, String),
    num(r.bytes_sent_per_step, fmtBytes), num(r.busbw_GBps, (v) => fmt(v * 1e9, "B/s")),
    num(r.instances, String), el("td", { text: r.predicted_link ?? "–" }),
    num(r.predicted_bytes, fmtBytes), num(r.predicted_busbw_GBps, (v) => fmt(v * 1e9, "B/s")),
    num(r.predicted_time_s, fmtSeconds)))));
}

// The ranks table: per rank, the mean step over the steady steps split into compute, exposed
// comm, bubble and idle (they add up to the step); the straggler is the headline's.
async function overlapChart(div, ranks, h, analysis) {
  const strag = h.straggler_rank;
  const x = ranks.map((r) => `rank ${r.rank}${r.rank === strag ? " ⚠ straggler" : ""}`);
  const u = axisUnit(ranks.map((r) => r.step_mean_s), "s");
  const part = (key, name, color) => ({ type: "bar", name, x, y: ranks.map((r) => (r[key] ?? 0) / u.div),
    marker: { color, line: { color: ranks.map((r) => (r.rank === strag ? "#b00020" : color)),
      width: ranks.map((r) => (r.rank === strag ? 3 : 0)) } },
    text: ranks.map((r) => `${name} rank ${r.rank}: ${fmtSeconds(r[key])} per step`),
    textposition: "none", hovertemplate: "%{text}<extra></extra>" });
  const overlapped = ranks.map((r) => r.overlap_mean_s / u.div);
  const traces = [part("compute_mean_s", "compute", "#4e79a7"),
    part("exposed_comm_mean_s", "exposed comm", "#e15759"),
    part("bubble_mean_s", "bubble", "#edc948"), part("idle_mean_s", "idle", "#bab0ac"),
    { type: "scatter", mode: "markers+text", name: "comm overlapped with compute", x,
      y: overlapped, marker: { color: COMPONENT_COLORS.optimizer, size: 10, symbol: "diamond" },
      text: ranks.map((r) => (r.overlap_pct === null ? "" : fmtPct(r.overlap_pct))),
      textposition: "top center", hovertemplate: `overlapped %{x}: %{y:.3g} ${u.unit}<extra></extra>` }];
  await plot(div, traces, layout(`Mean step per rank (${stepsLabel(h)}): compute, exposed comm, ` +
    "bubble, idle (◆ overlapped comm, % of the rank's comm)", "rank", u.title("time per step"),
  { barmode: "stack" }));
  div.dataset.stragglers = String(strag === null || strag === undefined ? 0 : 1);
  div.title = rule(analysis, "straggler");
}
