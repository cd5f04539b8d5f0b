// Loss, step time and throughput per step: the analysis' throughput table (the loss the job
// logged, the slowest rank's step span, tokens / step time). Both charts number steps the same
// way (global steps: a resumed run continues its parent's numbering) and span the same step
// range, so a step reads at the same place on each; a resumed run's parent loss is drawn under
// its own, dashed.
import { table } from "./analysis.js";
import { emptyChart, layout, PALETTE, plot } from "./charts.js";
import { esc } from "./dom.js";
import { axisUnit, fmt, rateUnit } from "./units.js";

// `parent`: {name, id, analysis} of the run this one resumed from, or null
export async function mountCurves(analysis, lossDiv, tputDiv, parent = null) {
  const rows = table(analysis, "throughput");
  const loss = rows.filter((r) => r.loss !== null);
  const timed = rows.filter((r) => r.step_s !== null);
  const parentLoss = parent ? table(parent.analysis, "throughput").filter((r) => r.loss !== null)
    : [];
  // one step range for both charts: every step either of them draws
  const steps = [...rows, ...parentLoss].map((r) => r.step).filter(Number.isFinite);
  const range = steps.length ? [Math.min(...steps) - 0.5, Math.max(...steps) + 0.5] : null;
  const xaxis = range ? { range, autorange: false } : {};
  if (loss.length || parentLoss.length) {
    const traces = [];
    if (parentLoss.length) {
      // trace names are Plotly text (a subset of HTML): the parent's name is escaped
      traces.push({ type: "scatter", mode: "lines", name: esc(`parent ${parent.name}`),
        x: parentLoss.map((r) => r.step), y: parentLoss.map((r) => r.loss),
        line: { dash: "dash", color: "#9a9a9a" }, meta: "parent",
        hovertemplate: "parent, step %{x}: %{y:.5g}<extra></extra>" });
    }
    // the run's own loss keeps its colour whether or not a parent's curve is drawn first
    traces.push({ type: "scatter", mode: "lines+markers", name: "loss",
      line: { color: PALETTE[0] }, marker: { color: PALETTE[0] },
      x: loss.map((r) => r.step), y: loss.map((r) => r.loss),
      hovertemplate: "step %{x}: %{y:.5g}<extra></extra>" });
    await plot(lossDiv, traces, layout("Training loss", "step", "loss", { xaxis }));
  } else emptyChart(lossDiv, "no loss recorded");
  if (timed.length) {
    const t = axisUnit(timed.map((r) => r.step_s), "s");
    const k = axisUnit(timed.map((r) => r.tokens_per_s), rateUnit(analysis?.headline));
    const traces = [{ type: "scatter", mode: "lines+markers", name: "step time",
      x: timed.map((r) => r.step), y: timed.map((r) => r.step_s / t.div),
      text: timed.map((r) => `step ${r.step}: ${fmt(r.step_s, "s")}`),
      hovertemplate: "%{text}<extra></extra>" }];
    if (timed.some((r) => r.tokens_per_s)) {
      traces.push({ type: "scatter", mode: "lines", name: "throughput", yaxis: "y2",
        x: timed.map((r) => r.step), y: timed.map((r) => r.tokens_per_s / k.div),
        text: timed.map((r) => `step ${r.step}: ${fmt(r.tokens_per_s, rateUnit(analysis?.headline))}`),
        line: { dash: "dot" }, hovertemplate: "%{text}<extra></extra>" });
    }
    await plot(tputDiv, traces, layout("Step time (slowest rank) and throughput", "step",
      t.title("step time"), {
        xaxis,
        yaxis2: { title: { text: k.title("throughput") }, overlaying: "y", side: "right",
          rangemode: "tozero" },
        yaxis: { rangemode: "tozero" },
        margin: { l: 70, r: 70, t: 45, b: 80 } }));
  } else emptyChart(tputDiv, "no step times recorded");
}
