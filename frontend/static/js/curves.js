// Loss and throughput curves from the run's summary (per-step loss and step times).
import { emptyChart, layout, plot } from "./charts.js";

export function tokensPerStep(summary) {
  const s = summary || {};
  return s.tokens_per_s && s.mean_step_time_s ? s.tokens_per_s * s.mean_step_time_s : null;
}

export async function mountCurves(run, lossDiv, tputDiv) {
  const s = run.summary || {};
  const loss = Array.isArray(s.loss) ? s.loss : [];
  const times = Array.isArray(s.step_time_s) ? s.step_time_s : [];
  if (loss.length) {
    await plot(lossDiv, [{ type: "scatter", mode: "lines+markers", name: "loss",
      x: loss.map((_, i) => i), y: loss, hovertemplate: "step %{x}: %{y:.5g}<extra></extra>" }],
    layout("Training loss", "step", "loss"));
  } else emptyChart(lossDiv, "no loss recorded");
  if (times.length) {
    const tps = tokensPerStep(s);
    const traces = [{ type: "scatter", mode: "lines+markers", name: "step time",
      x: times.map((_, i) => i), y: times.map((t) => t * 1e3),
      hovertemplate: "step %{x}: %{y:.3f} ms<extra></extra>" }];
    if (tps) {
      traces.push({ type: "scatter", mode: "lines", name: "throughput", yaxis: "y2",
        x: times.map((_, i) => i), y: times.map((t) => (t > 0 ? tps / t : null)),
        line: { dash: "dot" }, hovertemplate: "step %{x}: %{y:.4g} tokens/s<extra></extra>" });
    }
    await plot(tputDiv, traces, layout("Step time and throughput", "step", "step time (ms)", {
      yaxis2: { title: { text: "throughput (tokens/s)" }, overlaying: "y", side: "right" },
      margin: { l: 70, r: 70, t: 45, b: 80 } }));
  } else emptyChart(tputDiv, "no step times recorded");
}
