// Loss, step time and throughput per step: the analysis' throughput table (the loss the job
// logged, the slowest rank's step span, tokens / step time).
import { table } from "./analysis.js";
import { emptyChart, layout, plot } from "./charts.js";
import { axisUnit, fmt } from "./units.js";

export async function mountCurves(analysis, lossDiv, tputDiv) {
  const rows = table(analysis, "throughput");
  const loss = rows.filter((r) => r.loss !== null);
  const timed = rows.filter((r) => r.step_s !== null);
  if (loss.length) {
    await plot(lossDiv, [{ type: "scatter", mode: "lines+markers", name: "loss",
      x: loss.map((r) => r.step), y: loss.map((r) => r.loss),
      hovertemplate: "step %{x}: %{y:.5g}<extra></extra>" }],
    layout("Training loss", "step", "loss"));
  } else emptyChart(lossDiv, "no loss recorded");
  if (timed.length) {
    const t = axisUnit(timed.map((r) => r.step_s), "s");
    const k = axisUnit(timed.map((r) => r.tokens_per_s), "tok/s");
    const traces = [{ type: "scatter", mode: "lines+markers", name: "step time",
      x: timed.map((r) => r.step), y: timed.map((r) => r.step_s / t.div),
      text: timed.map((r) => `step ${r.step}: ${fmt(r.step_s, "s")}`),
      hovertemplate: "%{text}<extra></extra>" }];
    if (timed.some((r) => r.tokens_per_s)) {
      traces.push({ type: "scatter", mode: "lines", name: "throughput", yaxis: "y2",
        x: timed.map((r) => r.step), y: timed.map((r) => r.tokens_per_s / k.div),
        text: timed.map((r) => `step ${r.step}: ${fmt(r.tokens_per_s, "tok/s")}`),
        line: { dash: "dot" }, hovertemplate: "%{text}<extra></extra>" });
    }
    await plot(tputDiv, traces, layout("Step time (slowest rank) and throughput", "step",
      t.title("step time"), {
        yaxis2: { title: { text: k.title("throughput") }, overlaying: "y", side: "right",
          rangemode: "tozero" },
        yaxis: { rangemode: "tozero" },
        margin: { l: 70, r: 70, t: 45, b: 80 } }));
  } else emptyChart(tputDiv, "no step times recorded");
}
