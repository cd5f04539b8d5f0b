// Loss, step time and throughput per step: the analysis' throughput table (the loss the job
// logged, the slowest rank's step span, tokens / step time).
import { table } from "./analysis.js";
import { emptyChart, layout, plot } from "./charts.js";

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
    const traces = [{ type: "scatter", mode: "lines+markers", name: "step time",
      x: timed.map((r) => r.step), y: timed.map((r) => r.step_s * 1e3),
      hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>" }];
    if (timed.some((r) => r.tokens_per_s)) {
      traces.push({ type: "scatter", mode: "lines", name: "throughput", yaxis: "y2",
        x: timed.map((r) => r.step), y: timed.map((r) => r.tokens_per_s),
        line: { dash: "dot" }, hovertemplate: "step %{x}: %{y:.4g} tokens/s<extra></extra>" });
    }
    await plot(tputDiv, traces, layout("Step time (slowest rank) and throughput", "step",
      "step time (ms)", {
        yaxis2: { title: { text: "throughput (tokens/s)" }, overlaying: "y", side: "right" },
        margin: { l: 70, r: 70, t: 45, b: 80 } }));
  } else emptyChart(tputDiv, "no step times recorded");
}
