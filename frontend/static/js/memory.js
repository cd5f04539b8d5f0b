// Memory per rank, stacked by component, measured next to predicted, with the error: the
// analysis' memory table (jobs/analysis/memory.py). Transient components (pipeline receive
// buffers, ZeRO-3's gathered unit, data-parallel collective buffers: row kind "transient")
// are hatched and labelled as such; the table lists every rank x component with its kind.
// A rank's peak is the analysis' `total` row (every component summed, buffers included: the
// one definition of peak memory, jobs/analysis/memory.py), the figure the card, the runs list
// and compare show as "peak memory"; the bars stack to it.
import { table } from "./analysis.js";
import { COMPONENT_COLORS, emptyChart, layout, plot } from "./charts.js";
import { el, esc, fmtBytes, fmtPct } from "./dom.js";
import { axisUnit } from "./units.js";

// Aggregate rows (model_state = params + grads + optimizer) are listed but never stacked.
const AGGREGATES = new Set(["model_state", "total"]);
const parts = (rows) => rows.filter((r) => !AGGREGATES.has(r.component));

// Per rank {rank, measured, predicted, hasPred}: the `total` rows; an analysis stored before
// they existed (schema < 5) is summed here by the same rule.
export function memoryTotals(rows) {
  const stored = rows.filter((r) => r.component === "total");
  if (stored.length) {
    return stored.map((r) => ({ rank: r.rank, measured: r.measured_bytes || 0,
      predicted: r.predicted_bytes || 0,
      hasPred: r.predicted_bytes !== null && r.predicted_bytes !== undefined }))
      .sort((a, b) => a.rank - b.rank);
  }
  const by = new Map();
  for (const r of parts(rows)) {
    const t = by.get(r.rank) || { rank: r.rank, measured: 0, predicted: 0, hasPred: false };
    t.measured += r.measured_bytes || 0;
    if (r.predicted_bytes !== null && r.predicted_bytes !== undefined) {
      t.predicted += r.predicted_bytes;
      t.hasPred = true;
    }
    by.set(r.rank, t);
  }
  return [...by.values()].sort((a, b) => a.rank - b.rank);
}

export async function mountMemory(analysis, div, tableEl) {
  const rows = table(analysis, "memory");
  if (!rows.length) { emptyChart(div, "no memory samples in this run's trace"); return null; }
  const ranks = [...new Set(rows.map((r) => r.rank))].sort((a, b) => a - b);
  const comps = [...new Set(parts(rows).map((r) => r.component))];
  const xr = [];
  const xk = [];
  for (const r of ranks) { xr.push(`rank ${r}`, `rank ${r}`); xk.push("measured", "predicted"); }
  const totals = memoryTotals(rows);
  const ax = axisUnit(totals.flatMap((t) => [t.measured, t.predicted]), "B");
  const traces = comps.map((c) => {
    const y = [];
    const text = [];
    for (const r of ranks) {
      const row = rows.find((x) => x.rank === r && x.component === c);
      y.push((row?.measured_bytes ?? 0) / ax.div, (row?.predicted_bytes ?? 0) / ax.div);
      const t = `${esc(c)} rank ${r}<br>measured ${fmtBytes(row?.measured_bytes)}<br>` +
        `predicted ${fmtBytes(row?.predicted_bytes)}<br>error ${fmtPct(row?.error_pct)}`;
      text.push(t, t);
    }
    const transient = rows.some((x) => x.component === c && x.kind === "transient");
    const marker = { color: COMPONENT_COLORS[c] };
    if (transient) marker.pattern = { shape: "/" };
    return { type: "bar", name: esc(transient ? `${c} (transient)` : c), x: [xr, xk], y, text,
      textposition: "none", hovertemplate: "%{text}<extra></extra>", marker };
  });
  const annotations = totals.map((t) => ({
    x: [`rank ${t.rank}`, "predicted"], y: Math.max(t.measured, t.predicted) / ax.div,
    text: t.hasPred && t.predicted ? fmtPct(100 * (t.measured - t.predicted) / t.predicted)
      : "", showarrow: false, yanchor: "bottom", font: { size: 11 },
  }));
  const lay = layout("Peak memory per rank: measured vs predicted (error above)", "rank",
    ax.title("peak memory"), { barmode: "stack", annotations });
  await plot(div, traces, lay);
  div.dataset.ranks = String(ranks.length);
  // the busiest rank's stacked total: the headline's peak_memory_bytes (tests compare them)
  div.dataset.peakBytes = String(Math.max(...totals.map((t) => t.measured)));
  if (tableEl) {
    tableEl.replaceChildren(el("thead", {}, el("tr", {}, ...["rank", "component", "kind",
      "measured", "predicted", "error"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows.map((r) => el("tr", { dataset: { rank: r.rank, component: r.component } },
      el("td", { text: r.rank }), el("td", { text: r.component }),
      el("td", { text: r.kind || "" }),
      el("td", { class: "num", text: fmtBytes(r.measured_bytes) }),
      el("td", { class: "num", text: fmtBytes(r.predicted_bytes) }),
      el("td", { class: "num", text: fmtPct(r.error_pct) })))));
  }
  return rows;
}
