// Mixture of experts (issue 17): the expert-load heat map (expert x step, one MoE layer or all
// summed) and the all-to-all rank x rank matrix, from the analysis' expert_load and all_to_all
// tables (jobs/analysis/moe.py), with the headline's imbalance and dropped fraction. The page
// only adds table cells up for the view it draws (layers for "all layers", steps for "all
// steps"); every figure it names is the analysis'.
import { headlineOf, stepsLabel, table } from "./analysis.js";
import { emptyChart, layout, plot } from "./charts.js";
import { $, el, esc, fmtBytes, fmtNum, fmtPct } from "./dom.js";

const ALL = "all";
const uniq = (xs) => [...new Set(xs)].sort((a, b) => a - b);

// A MoE run: the spec has experts, or the traces routed tokens (older spec-less traces).
export const isMoe = (analysis) => Number(analysis?.spec?.model?.experts || 0) > 0 ||
  table(analysis, "expert_load").length > 0;

// z[expert][step] of the rows of one layer (or every layer, summed); the hottest expert of
// what is drawn is the one with the most tokens over the drawn steps.
export function loadMatrix(rows, layer) {
  const use = rows.filter((r) => layer === ALL || r.layer === Number(layer));
  const steps = uniq(use.map((r) => r.step));
  const experts = uniq(use.map((r) => r.expert));
  const z = experts.map(() => steps.map(() => 0));
  const dropped = experts.map(() => steps.map(() => 0));
  for (const r of use) {
    const e = experts.indexOf(r.expert);
    const s = steps.indexOf(r.step);
    z[e][s] += r.tokens;
    dropped[e][s] += r.dropped;
  }
  const totals = z.map((row) => row.reduce((a, b) => a + b, 0));
  const hot = totals.length ? experts[totals.indexOf(Math.max(...totals))] : null;
  return { steps, experts, z, dropped, hot };
}

// bytes[src][dst] over one step (or every step, summed)
export function a2aMatrix(rows, step) {
  const use = rows.filter((r) => step === ALL || r.step === Number(step));
  const ranks = uniq(use.flatMap((r) => [r.src, r.dst]));
  const z = ranks.map(() => ranks.map(() => null)); // null: not in one EP group
  for (const r of use) {
    const i = ranks.indexOf(r.src);
    const j = ranks.indexOf(r.dst);
    z[i][j] = (z[i][j] || 0) + r.bytes;
  }
  return { ranks, z };
}

function options(sel, values, label) {
  const prev = sel.value;
  sel.replaceChildren(el("option", { value: ALL, text: label }),
    ...values.map((v) => el("option", { value: String(v), text: String(v) })));
  if ([ALL, ...values.map(String)].includes(prev)) sel.value = prev;
}

// Plotly's YlOrRd and Blues run dark to light: reversed, the largest value is the darkest;
// colours start at 0, so a pale cell is a small count, not merely the smallest one.
async function drawLoad(div, rows, layer) {
  const m = loadMatrix(rows, layer);
  if (!m.steps.length) { emptyChart(div, "no routed tokens in this layer"); return; }
  const ylab = m.experts.map((e) => `expert ${e}`);
  const text = m.z.map((row, i) => row.map((t, j) => `expert ${m.experts[i]}, step ` +
    `${m.steps[j]}: ${t} tokens routed, ${m.dropped[i][j]} dropped`));
  const where = layer === ALL ? "all layers summed" : `layer ${esc(layer)}`;
  await plot(div, [{ type: "heatmap", x: m.steps, y: ylab, z: m.z, text,
    zmin: 0, colorscale: "YlOrRd", reversescale: true, colorbar: { title: { text: "tokens" } },
    hovertemplate: "%{text}<extra></extra>" }],
  layout(`Tokens routed per expert and step (${where})`, "step", "expert",
  { showlegend: false, yaxis: { type: "category" } }));
  div.dataset.hottestExpert = m.hot === null ? "" : String(m.hot);
  div.dataset.layer = String(layer);
  div.dataset.experts = String(m.experts.length);
}

async function drawA2a(div, rows, step) {
  const m = a2aMatrix(rows, step);
  if (!m.ranks.length) {
    emptyChart(div, "no all-to-all in this run (ep = 1: every expert is on every rank)");
    div.dataset.ranks = "0";
    return;
  }
  const lab = m.ranks.map((r) => `rank ${r}`);
  const text = m.z.map((row, i) => row.map((b, j) => (b === null ? "" : `rank ${m.ranks[i]} → ` +
    `rank ${m.ranks[j]}: ${fmtBytes(b)}${i === j ? " (stays local)" : ""}`)));
  const where = step === ALL ? "all steps" : `step ${esc(step)}`;
  await plot(div, [{ type: "heatmap", x: lab, y: lab, z: m.z, text, zmin: 0, colorscale: "Blues",
    reversescale: true,
    colorbar: { title: { text: "bytes" } }, hovertemplate: "%{text}<extra></extra>" }],
  layout(`All-to-all bytes, source → destination (${where})`,
    "destination rank", "source rank", { showlegend: false,
      xaxis: { type: "category" }, yaxis: { type: "category", autorange: "reversed" } }));
  div.dataset.ranks = m.ranks.join(",");
}

// Mounts the section (shown for MoE runs only); returns whether it is shown.
export async function mountMoe(analysis, section) {
  if (!section) return false;
  section.hidden = !isMoe(analysis);
  if (section.hidden) return false;
  const h = headlineOf(analysis);
  const load = table(analysis, "expert_load");
  const a2a = table(analysis, "all_to_all");
  const hot = h.hottest_expert;
  $("#moe-summary").textContent = [
    `imbalance ${fmtNum(h.expert_imbalance)} (max / mean tokens per expert, worst layer, ` +
      `median of ${stepsLabel(h)})`,
    `dropped ${fmtPct(h.dropped_tokens_fraction, true)} of routed tokens`,
    hot === null || hot === undefined ? null : `hottest expert ${hot}`,
  ].filter(Boolean).join(" · ");
  const layerSel = $("#moe-layer");
  const stepSel = $("#moe-step");
  options(layerSel, uniq(load.map((r) => r.layer)), "all layers (sum)");
  options(stepSel, uniq(a2a.map((r) => r.step)), "all steps (sum)");
  const loadDiv = $("#moe-load");
  const a2aDiv = $("#moe-a2a");
  layerSel.onchange = () => drawLoad(loadDiv, load, layerSel.value);
  stepSel.onchange = () => drawA2a(a2aDiv, a2a, stepSel.value);
  if (load.length) await drawLoad(loadDiv, load, layerSel.value);
  else emptyChart(loadDiv, "no routing records (moe) in this run's trace");
  await drawA2a(a2aDiv, a2a, stepSel.value);
  return true;
}
