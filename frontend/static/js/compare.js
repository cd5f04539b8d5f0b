// Compare 2-4 runs (/compare?ids=a,b): a config diff that highlights what differs, step-time
// breakdown, memory per rank, busbw and overlaid loss curves. The URL is the shareable view.
import { api } from "./api.js";
import { PALETTE, emptyChart, layout, plot } from "./charts.js";
import { busbwTraces } from "./comm.js";
import { $, degrees, el, esc, fmtSeconds, headline, statusBadge } from "./dom.js";
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

function heads(runs) {
  $("#compare-heads").replaceChildren(...runs.map((r) => {
    const h = headline(r);
    return el("div", { class: "card" }, el("div", { class: "label", text: r.id }),
      el("div", { class: "value", text: r.name }), el("div", { class: "sub" }, statusBadge(r.status),
        ` ${r.strategy} · ${degrees(r)} · step ${fmtSeconds(h.step_time_s)}`));
  }));
}

async function charts(runs) {
  const names = runs.map((r) => esc(label(r)));
  const [bds, mems, comms] = await Promise.all([
    Promise.all(runs.map((r) => api.breakdown(r.id).catch(() => null))),
    Promise.all(runs.map((r) => api.memory(r.id).catch(() => null))),
    Promise.all(runs.map((r) => api.comm(r.id).catch(() => null)))]);
  const parts = [["compute_s", "compute", "#4e79a7"], ["exposed_comm_s", "exposed comm", "#e15759"],
    ["bubble_s", "bubble", "#edc948"], ["idle_s", "idle", "#bab0ac"]];
  if (bds.some(Boolean)) {
    await plot($("#cmp-breakdown"), parts.map(([k, n, c]) => ({ type: "bar", name: n, x: names,
      y: bds.map((b) => (b?.mean?.[k] ?? 0) * 1e3), marker: { color: c },
      hovertemplate: `${n}: %{y:.3f} ms<extra></extra>` })),
    layout("Step time breakdown (mean per step and rank)", "run", "time (ms)", { barmode: "stack" }));
  } else emptyChart($("#cmp-breakdown"), "no traces to break down");
  const memTraces = mems.map((m, i) => {
    const t = memoryTotals(m?.rows || []);
    return { type: "bar", name: names[i], x: t.map((x) => `rank ${x.rank}`),
      y: t.map((x) => x.measured / 1e6), marker: { color: PALETTE[i] },
      hovertemplate: `${names[i]}<br>%{x}: %{y:.4g} MB<extra></extra>` };
  }).filter((t) => t.x.length);
  if (memTraces.length) {
    await plot($("#cmp-memory"), memTraces, layout("Peak memory per rank (measured)", "rank",
      "memory (MB)", { barmode: "group" }));
  } else emptyChart($("#cmp-memory"), "no memory samples");
  const bw = comms.flatMap((c, i) => (c ? busbwTraces(c.collectives, `${label(runs[i])}: `,
    DASHES[i]) : []));
  if (bw.length) {
    await plot($("#cmp-busbw"), bw, layout("Bus bandwidth per collective", "message size (bytes)",
      "busbw (GB/s)", { xaxis: { type: "log" }, yaxis: { type: "log" } }));
  } else emptyChart($("#cmp-busbw"), "no collectives");
  const loss = runs.filter((r) => r.summary?.loss?.length).map((r, i) => ({
    type: "scatter", mode: "lines+markers", name: esc(label(r)), x: r.summary.loss.map((_, j) => j),
    y: r.summary.loss, line: { dash: DASHES[i % 4] },
    hovertemplate: `${esc(label(r))}<br>step %{x}: %{y:.5g}<extra></extra>` }));
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
  heads(runs);
  diffTable(runs);
  $("#show-all").addEventListener("change", () => diffTable(runs));
  await charts(runs);
  document.body.dataset.chartsReady = "1";
}

init();
