// Compare 2-4 runs (/compare?ids=a,b): a config diff that highlights what differs, step-time
// breakdown, memory per rank, busbw and overlaid loss curves. The URL is the shareable view.
import { headlineOf, stepsLabel, table } from "./analysis.js";
import { api } from "./api.js";
import { PALETTE, emptyChart, layout, plot } from "./charts.js";
import { busbwTraces } from "./comm.js";
import { $, degrees, el, esc, fmtPct, fmtSeconds, statusBadge } from "./dom.js";
import { memoryTotals } from "./memory.js";

const DASHES = ["solid", "dash", "dot", "dashdot"];
const ids = (new URLSearchParams(location.search).get("ids") || "").split(",")
  .map((s) => s.trim()).filter(Boolean).slice(0, 4);

function flatten(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    const path = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, path, out);
    else out[path] = v;
  }
  return out;
}

const label = (r) => `${r.name} (${r.id})`;
const show = (v) => (v === undefined ? "—" : Array.isArray(v) ? v.join(", ") : String(v));

function diffTable(runs) {
  const flat = runs.map((r) => ({ strategy: r.strategy, world_size: r.world_size,
    degrees: degrees(r), ...flatten(r.spec) }));
  const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))];
  const showAll = $("#show-all").checked;
  const rows = [];
  let differing = 0;
  for (const k of keys) {
    const vals = flat.map((f) => JSON.stringify(f[k]));
    const differs = new Set(vals).size > 1;
    if (differs) differing++;
    if (!differs && !showAll) continue;
    rows.push(el("tr", { class: differs ? "diff" : "", dataset: { field: k, differs: String(differs) } },
      el("td", { text: k }), ...flat.map((f) => el("td", { text: show(f[k]) }))));
  }
  $("#config-diff").replaceChildren(
    el("thead", {}, el("tr", {}, el("th", { text: `field (${differing} differ)` }),
      ...runs.map((r) => el("th", {}, el("a", { href: `/runs/${encodeURIComponent(r.id)}`,
        text: label(r) }))))),
    el("tbody", {}, ...rows));
}

function heads(runs, analyses) {
  $("#compare-heads").replaceChildren(...runs.map((r, i) => {
    const h = headlineOf(analyses[i]);
    return el("div", { class: "card", dataset: { run: r.id, stepTime: h.step_time_s ?? "" } },
      el("div", { class: "label", text: r.id }),
      el("div", { class: "value", text: r.name }), el("div", { class: "sub" }, statusBadge(r.status),
        ` ${r.strategy} · ${degrees(r)} · step ${fmtSeconds(h.step_time_s)} (median of ` +
        `${stepsLabel(h)}) · bubble ${fmtPct(h.bubble_fraction, true)}`));
  }));
}

async function charts(runs, analyses) {
  const names = runs.map((r) => esc(label(r)));
  const heads = analyses.map(headlineOf);
  const parts = [["compute_s", "compute", "#4e79a7"], ["exposed_comm_s", "exposed comm", "#e15759"],
    ["bubble_s", "bubble", "#edc948"], ["idle_s", "idle", "#bab0ac"]];
  if (analyses.some(Boolean)) {
    await plot($("#cmp-breakdown"), parts.map(([k, n, c]) => ({ type: "bar", name: n, x: names,
      y: heads.map((h) => (h[k] ?? 0) * 1e3), marker: { color: c },
      customdata: heads.map((h) => stepsLabel(h)),
      hovertemplate: `${n}: %{y:.3f} ms (%{customdata})<extra></extra>` })),
    layout("Step time breakdown (mean per steady step and rank)", "run", "time (ms)",
      { barmode: "stack" }));
  } else emptyChart($("#cmp-breakdown"), "no traces to break down");
  const memTraces = analyses.map((a, i) => {
    const t = memoryTotals(table(a, "memory"));
    return { type: "bar", name: names[i], x: t.map((x) => `rank ${x.rank}`),
      y: t.map((x) => x.measured / 1e6), marker: { color: PALETTE[i] },
      hovertemplate: `${names[i]}<br>%{x}: %{y:.4g} MB<extra></extra>` };
  }).filter((t) => t.x.length);
  if (memTraces.length) {
    await plot($("#cmp-memory"), memTraces, layout("Peak memory per rank (measured)", "rank",
      "memory (MB)", { barmode: "group" }));
  } else emptyChart($("#cmp-memory"), "no memory samples");
  const bw = analyses.flatMap((a, i) => busbwTraces(table(a, "bandwidth"), `${label(runs[i])}: `,
    DASHES[i]));
  if (bw.length) {
    await plot($("#cmp-busbw"), bw, layout("Bus bandwidth per collective", "message size (bytes)",
      "busbw (GB/s)", { xaxis: { type: "log" }, yaxis: { type: "log" } }));
  } else emptyChart($("#cmp-busbw"), "no collectives");
  const loss = analyses.map((a, i) => {
    const rows = table(a, "throughput").filter((x) => x.loss !== null);
    return { type: "scatter", mode: "lines+markers", name: names[i], x: rows.map((x) => x.step),
      y: rows.map((x) => x.loss), line: { dash: DASHES[i % 4] },
      hovertemplate: `${names[i]}<br>step %{x}: %{y:.5g}<extra></extra>` };
  }).filter((t) => t.x.length);
  if (loss.length) await plot($("#cmp-loss"), loss, layout("Loss", "step", "loss"));
  else emptyChart($("#cmp-loss"), "no loss curves");
}

async function init() {
  $("#compare-ids").value = ids.join(",");
  $("#compare-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const list = $("#compare-ids").value.split(/[\s,]+/).filter(Boolean);
    location.href = `/compare?ids=${list.map(encodeURIComponent).join(",")}`;
  });
  if (ids.length < 2) {
    $("#compare-error").textContent = "Pick 2 to 4 runs on the Runs page, or enter their IDs.";
    return;
  }
  let runs;
  try { runs = await Promise.all(ids.map((id) => api.run(id))); } catch (e) {
    $("#compare-error").textContent = e.message;
    return;
  }
  const analyses = await Promise.all(runs.map((r) => api.metrics(r.id).catch(() => null)));
  heads(runs, analyses);
  diffTable(runs);
  $("#show-all").addEventListener("change", () => diffTable(runs));
  await charts(runs, analyses);
  document.body.dataset.chartsReady = "1";
}

init();
