// The compare page's key figures: which figures, how a run's value is read from its analysis,
// the noise each figure is judged against, the verdict (better / worse / same within noise)
// and the delta's wording. Every value is a cell of a run's analysis (GET /metrics).
import { table } from "./analysis.js";
import { fmt } from "./units.js";

const duration = (r) => (r.started_at && r.finished_at
  ? (new Date(r.finished_at) - new Date(r.started_at)) / 1000 : null);
const finalLoss = (a) => {
  const rows = table(a, "throughput").filter((x) => x.loss !== null);
  return rows.length ? rows[rows.length - 1].loss : null;
};

// [key, label, unit, better ("low" | "high"), value(run, headline, analysis)]
export const FIGURES = [
  ["step_time_s", "step time (median)", "s", "low", (r, h) => h.step_time_s],
  ["tokens_per_s", "throughput", "tok/s", "high", (r, h) => h.tokens_per_s],
  ["peak_memory_bytes", "peak memory (busiest rank)", "B", "low", (r, h) => h.peak_memory_bytes],
  ["exposed_comm_s", "exposed comm per step", "s", "low", (r, h) => h.exposed_comm_s],
  ["bubble_fraction", "pipeline bubble", "%", "low",
    (r, h) => (h.bubble_fraction === null || h.bubble_fraction === undefined ? null
      : 100 * h.bubble_fraction)],
  ["overlap_pct", "comm hidden under compute", "%", "high", (r, h) => h.overlap_pct],
  ["comm_bytes_per_rank", "bytes sent per step (busiest rank)", "B", "low",
    (r, h) => h.comm_bytes_per_rank],
  ["final_loss", "final loss", "", "low", (r, h, a) => finalLoss(a)],
  ["duration_s", "run duration", "s", "low", (r) => duration(r)],
];

// Noise. A figure with a per-step series is judged against the larger of the two runs'
// interquartile ranges (IQR) of that series over their steady steps: step time and
// throughput (throughput table), exposed comm (step_rank, mean over ranks per step), loss.
// Figures derived from time without a series of their own (bubble, overlap, duration) take
// the step time's relative IQR times the larger value. Memory and bytes are counts: exact.
// Under 0.5 % of the larger value is always the same (rounding).
export const NOISE_RULE = "Same within noise: the difference is at most the larger of the two "
  + "runs' interquartile range (IQR) of the per-step values over their steady steps (step time, "
  + "throughput, exposed comm, loss); bubble, overlap and duration use the step time's IQR "
  + "relative to its median; memory and bytes are exact; under 0.5 % always counts as same.";
const SERIES = {
  step_time_s: (a) => steady(a, table(a, "throughput").map((x) => [x.step, x.step_s])),
  tokens_per_s: (a) => steady(a, table(a, "throughput").map((x) => [x.step, x.tokens_per_s])),
  final_loss: (a) => steady(a, table(a, "throughput").map((x) => [x.step, x.loss])),
  exposed_comm_s: (a) => {
    const per = new Map();
    for (const x of table(a, "step_rank")) {
      if (x.exposed_comm_s === null || x.exposed_comm_s === undefined) continue;
      if (!per.has(x.step)) per.set(x.step, []);
      per.get(x.step).push(x.exposed_comm_s);
    }
    return steady(a, [...per].map(([s, v]) => [s, v.reduce((p, q) => p + q, 0) / v.length]));
  },
};
const RELATIVE = new Set(["bubble_fraction", "overlap_pct", "duration_s"]);
const FLOOR = 0.005;

function steady(a, pairs) {
  const s = a?.headline?.steady_steps;
  return pairs.filter(([step, v]) => v !== null && v !== undefined && Number.isFinite(v)
    && (!s || (step >= s[0] && step <= s[1]))).map(([, v]) => v);
}

function quantile(sorted, q) {
  const i = (sorted.length - 1) * q;
  const lo = Math.floor(i);
  return sorted[lo] + (sorted[Math.ceil(i)] - sorted[lo]) * (i - lo);
}

// the interquartile range of the values; null below two values
export function iqr(values) {
  if (values.length < 2) return null;
  const s = [...values].sort((p, q) => p - q);
  return quantile(s, 0.75) - quantile(s, 0.25);
}

// the noise a difference between two runs (their analyses a, b) of figure `key` is judged by,
// with the rule's name: [noise in the figure's unit or null, "step-time IQR" ...]
export function noiseOf(key, a, b, va, vb) {
  if (SERIES[key]) {
    const n = [iqr(SERIES[key](a)), iqr(SERIES[key](b))].filter((x) => x !== null);
    return [n.length ? Math.max(...n) : null, "per-step IQR"];
  }
  if (RELATIVE.has(key)) {
    const rel = [a, b].map((x) => {
      const v = SERIES.step_time_s(x);
      const q = iqr(v);
      const med = v.length ? quantile([...v].sort((p, q2) => p - q2), 0.5) : null;
      return q !== null && med ? q / med : null;
    }).filter((x) => x !== null);
    return [rel.length ? Math.max(...rel) * Math.max(Math.abs(va), Math.abs(vb)) : null,
      "step-time IQR, relative"];
  }
  return [0, "exact"];
}

// "better" | "worse" | "same" for the value v against the baseline's, and the threshold used
export function verdict(v, base, better, noise) {
  const limit = Math.max(noise ?? 0, FLOOR * Math.max(Math.abs(v), Math.abs(base)));
  const d = v - base;
  if (Math.abs(d) <= limit) return ["same", limit];
  return [(better === "low" ? d < 0 : d > 0) ? "better" : "worse", limit];
}

// step time, throughput and duration read as "× slower / faster"; other amounts as the
// difference with the ratio beside it ("+12.0 ms (14.2×)"); percentages in points
const WORDS = { step_time_s: ["slower", "faster"], duration_s: ["slower", "faster"],
  tokens_per_s: ["faster", "slower"] };

// [text, class]: the run's value against the baseline's; "" class within noise
export function delta(v, base, unit, better, key = "", same = false) {
  if (v === null || v === undefined || base === null || base === undefined) return ["", ""];
  const d = v - base;
  const good = better === "low" ? d < 0 : d > 0;
  const cls = same ? "" : good ? "good" : "bad";
  const sign = d > 0 ? "+" : "−";
  if (d === 0) return ["same", ""];
  if (unit === "%") return [`${sign}${fmt(Math.abs(d), "")} points`, cls];
  if (base === 0) return [`${sign}${fmt(Math.abs(d), unit)} (baseline 0)`, cls];
  const ratio = v / base;
  const big = ratio >= 1.5 || (ratio > 0 && ratio <= 1 / 1.5);
  const x = fmt(ratio >= 1 ? ratio : 1 / ratio, "", { trim: true });
  if (WORDS[key] && big) return [`${x}× ${WORDS[key][ratio > 1 ? 0 : 1]}`, cls];
  const r = fmt(ratio, "", { trim: true });
  if (big && unit) return [`${sign}${fmt(Math.abs(d), unit)} (${r}×)`, cls];
  const pct = 100 * (ratio - 1);
  return [`${pct > 0 ? "+" : "−"}${fmt(Math.abs(pct), "%")}`, cls];
}
