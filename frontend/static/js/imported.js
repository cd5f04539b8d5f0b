// The run page of an import (kind "import", POST /api/imports): instead of the training cards
// and charts, the figures Holistic Trace Analysis defines on the imported profiler traces, as
// the analysis' `kineto` section holds them (jobs/kineto/imports.py, breakdown.py): per rank
// idle / compute / non-compute time and overlap (table + stacked bars), the kernel-type
// breakdown and the top kernels, each beside its rule text from `kineto.rules` ("HTA's
// definition: …"), and where the traces came from (summary.import). The page computes no
// figure: every number shown is the API's, and each cell carries it raw in data-value.
import { emptyChart, layout, plot } from "./charts.js";
import { el, esc } from "./dom.js";

const DEF = "HTA's definition: ";
const COLORS = { idle: "#bab0ac", compute: "#59a14f", non_compute: "#f28e2b", overlap: "#4e79a7" };
// the rules every figure shares: which events are kernels, their type, the merge (any rule
// the section has that no figure below names is listed with them)
const SHARED = ["gpu_event", "gpu_kernels", "kernel_type", "merge", "ns_rounding"];
const KNOWN = new Set(["temporal", "kernel_types", "top_kernels", "rules", "note"]);
// a list the section holds beyond HTA's three figures: its title and the rules beside it
const MORE = { launches: ["Kernel launches (CPU → GPU)", [["launch_delay_us", "launch delay"],
  ["cpu_duration_us", "CPU launch time"], ["short_kernels", "short kernels"]]] };
const TEMPORAL = [
  ["kernel_time_us", "kernel time", "us"], ["idle_time_us", "idle", "us"],
  ["compute_time_us", "compute", "us"], ["non_compute_time_us", "non-compute", "us"],
  ["idle_pct", "idle %", "pct"], ["compute_pct", "compute %", "pct"],
  ["non_compute_pct", "non-compute %", "pct"], ["overlap_pct", "overlap %", "pct"]];
const TOP = [["rank", "rank", "int"], ["kernel_type", "type", "text"], ["name", "kernel", "text"],
  ["count", "count", "int"], ["sum_us", "sum", "us"], ["mean_us", "mean", "us"],
  ["min_us", "min", "us"], ["max_us", "max", "us"]];

const missing = (x) => x === null || x === undefined;
// µs as HTA prints them (whole microseconds, thousands separated); percentages to 2 decimals
// (HTA's *_pctg columns round the same way)
function show(value, kind) {
  if (kind === "text") return missing(value) ? "–" : String(value);
  if (missing(value) || !Number.isFinite(Number(value))) return "–";
  const v = Number(value);
  if (kind === "pct") return `${v.toFixed(2)} %`;
  if (kind === "us") return `${v.toLocaleString("en-US", { maximumFractionDigits: 1 })} µs`;
  return v.toLocaleString("en-US");
}

// a column of a list the page does not know: its kind from its name and values
function columnsOf(rows) {
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  return keys.map((k) => [k, k.replace(/_us$/, "").replace(/_pct$/, " %").replace(/_/g, " "),
    /_us$/.test(k) ? "us" : /_pct$/.test(k)
    ? "pct" : rows.some((r) => typeof r[k] === "string") ? "text" : "int"]);
}

const ruleText = (text) => DEF + String(text).replace(/^HTA: /, "");

// The rule of each figure, beside it: a <dl> of figure name -> HTA's definition.
function rulesBox(rules, keys, title) {
  return el("dl", { class: "figure-rules", "aria-label": title },
    ...keys.filter(([k]) => rules[k]).flatMap(([k, label]) => [
      el("dt", { text: label }),
      el("dd", { dataset: { rule: k }, title: rules[k], text: ruleText(rules[k]) })]));
}

function dataTable(id, cols, rows, caption) {
  return el("div", { class: "table-wrap" }, el("table", { id, class: "data compact" },
    caption ? el("caption", { class: "muted small", text: caption }) : null,
    el("thead", {}, el("tr", {}, ...cols.map(([k, label, kind]) => el("th", { text: label,
      class: kind === "text" ? null : "num", dataset: { col: k } })))),
    el("tbody", {}, ...rows.map((r) => el("tr", { dataset: { rank: missing(r.rank) ? null
      : String(r.rank) } }, ...cols.map(([k, , kind]) => el("td", {
      class: k === "name" ? "kernel-name" : kind === "text" ? null : "num",
      dataset: { col: k, value: missing(r[k]) ? "" : String(r[k]) } },
      // a kernel's name (C++ templates run to thousands of characters): three lines, whole
      // on hover
      k === "name" ? el("span", { class: "clamp", title: String(r[k] ?? ""), text: show(r[k],
        kind) }) : show(r[k], kind))))))));
}

function sourceBox(run) {
  const s = run.summary?.import || {};
  const ranks = Array.isArray(s.ranks) ? s.ranks : [];
  const files = Array.isArray(s.files) ? s.files : [];
  const item = (key, label, value) => [el("dt", { text: label }),
    el("dd", { dataset: { key }, text: value })];
  return el("dl", { class: "import-source", id: "import-source" },
    ...item("source", "source", s.source === "kineto" ? "PyTorch profiler (Kineto) traces"
      : String(s.source ?? "–")),
    ...item("ranks", "ranks", ranks.length ? `${ranks.join(", ")} (${ranks.length} of world ` +
      `size ${s.world_size ?? "–"})` : "–"),
    ...item("world_size", "world size", String(s.world_size ?? "–")),
    ...item("backend", "backend", String(s.backend ?? "–")),
    ...item("records", "records", missing(s.records) ? "–" : show(s.records, "int")),
    el("dt", { text: `files (${files.length})` }),
    el("dd", {}, el("ul", { class: "plain", id: "import-files" },
      ...files.map((f) => el("li", { text: String(f) })))));
}

// Cards for the top of the page (run.js renderCards): what was imported.
export function importCards(run) {
  const s = run.summary?.import || {};
  const ranks = Array.isArray(s.ranks) ? s.ranks : [];
  const card = (key, label, value, sub) => el("div", { class: "card", dataset: { card: label,
    key, value: String(value ?? "") } }, el("div", { class: "label", text: label }),
  el("div", { class: "value", text: String(value ?? "–") }), sub ? el("div", { class: "sub",
    text: sub }) : null);
  return [
    card("ranks", "ranks imported", ranks.length, `of world size ${s.world_size ?? "–"}`),
    card("backend", "backend", s.backend, "the traces' distributedInfo"),
    card("files", "files", Array.isArray(s.files) ? s.files.length : null, "profiler traces"),
    card("records", "records", s.records, "converted into paralab's trace schema")];
}

async function temporalChart(div, rows) {
  const x = rows.map((r) => `rank ${r.rank}`);
  const bar = (key, name, color) => ({ type: "bar", name, x, y: rows.map((r) => r[`${key}_pct`]),
    marker: { color }, customdata: rows.map((r) => r[`${key}_time_us`]),
    hovertemplate: `${esc(name)} %{y:.2f} % (%{customdata:,} µs)<extra>%{x}</extra>` });
  const traces = [bar("compute", "compute", COLORS.compute),
    bar("non_compute", "non-compute", COLORS.non_compute), bar("idle", "idle", COLORS.idle),
    { type: "scatter", mode: "markers", name: "overlap (% of communication time)", x,
      y: rows.map((r) => r.overlap_pct), marker: { color: COLORS.overlap, size: 11,
        symbol: "diamond" }, hovertemplate: "overlap %{y:.2f} %<extra>%{x}</extra>" }];
  await plot(div, traces, layout("Share of kernel time per rank",
    "rank", "% of kernel time", { barmode: "stack", yaxis: { range: [0, 100] } }));
}

async function typesChart(div, rows) {
  const sorted = [...rows].reverse(); // largest on top
  await plot(div, [{ type: "bar", orientation: "h", y: sorted.map((r) => esc(r.kernel_type)),
    x: sorted.map((r) => r.pct), customdata: sorted.map((r) => r.sum_us), showlegend: false,
    marker: { color: COLORS.overlap },
    hovertemplate: "%{y}: %{x:.2f} % (%{customdata:,} µs)<extra></extra>" }],
  layout("Kernel types: share of kernel time, all ranks", "% of the sum over all ranks", "",
    { margin: { l: 20, r: 20, t: 45, b: 60 } }));
}

// A figure: its title, then its chart(s) with the rules beside them, then `below` (a table
// wider than the chart's column) across the page.
function figure(id, title, body, rules, { wide = false, below = null } = {}) {
  return el("section", { class: "imported-figure", id }, el("h3", { text: title }),
    el("div", { class: wide ? "with-rules wide" : "with-rules" }, el("div", {}, ...body), rules),
    below);
}

// Draw the imported figures into `section` and hide the training sections an import has no
// data for. Errors are shown in the section, never thrown (the rest of the page goes on).
export async function mountImported(run, analysis, section) {
  section.hidden = false;
  // an import has no spec to edit and run again: no "Clone & edit"
  if (document.getElementById("clone-link")) document.getElementById("clone-link").hidden = true;
  // the engine's own sections stay where the traces fed them (collectives matched across
  // ranks, bandwidth, stragglers; the allocator's memory; step times): only what an import
  // cannot have is hidden
  const rows = (t) => (analysis?.tables?.[t] || []).length > 0;
  const curves = (analysis?.tables?.throughput || []).some((r) => r.loss != null
    || r.tokens_per_s != null);
  const none = { "memory-section": !rows("memory"), "comm-section": !rows("collectives"),
    "curves-section": !curves, "moe-section": true, "log-section": true }; // nothing ran here
  for (const [id, hide] of Object.entries(none)) {
    const s = document.getElementById(id);
    if (s && hide) s.hidden = true;
  }
  const k = analysis?.kineto;
  const rules = k?.rules || {};
  const parts = [el("h2", { text: "Imported traces" }), sourceBox(run)];
  if (!k) {
    parts.push(el("p", { class: "muted", id: "imported-note", text: analysis
      ? "This run's analysis has no HTA figures (kineto section)." : "No analysis for this run." }));
    section.replaceChildren(...parts);
    section.dataset.ready = "1";
    return;
  }
  if (k.note) parts.push(el("p", { class: "muted", id: "imported-note", text: k.note }));
  const temporal = [...(k.temporal || [])].sort((a, b) => a.rank - b.rank);
  const types = k.kernel_types || [];
  const top = k.top_kernels || [];
  const tChart = el("div", { id: "imp-temporal-chart", class: "chart" });
  const kChart = el("div", { id: "imp-types-chart", class: "chart" });
  parts.push(
    figure("imp-temporal-figure", "Per rank: idle, compute, non-compute and overlap",
      [tChart], rulesBox(rules, TEMPORAL, "rules of the per-rank figures"),
      { below: dataTable("imp-temporal", [["rank", "rank", "int"], ...TEMPORAL], temporal) }),
    figure("imp-types-figure", "Kernel types", [kChart, dataTable("imp-kernel-types",
      [["kernel_type", "kernel type", "text"], ["sum_us", "time", "us"], ["pct", "share", "pct"]],
      types)], rulesBox(rules, [["kernel_type_breakdown", "kernel-type breakdown"],
      ["kernel_type", "kernel type"]], "rules of the kernel-type breakdown")),
    figure("imp-top-figure", "Top kernels", [dataTable("imp-top-kernels", TOP, top,
      "per rank and kernel type, largest total first")],
    rulesBox(rules, [["top_kernels", "top kernels"]], "rule of the top kernels"), { wide: true }),
  );
  const beside = new Set([...TEMPORAL, ["kernel_type_breakdown"], ["top_kernels"]].map(([x]) => x));
  for (const [key, rows] of Object.entries(k)) {
    if (KNOWN.has(key) || !Array.isArray(rows) || !rows.length || typeof rows[0] !== "object") {
      continue;
    }
    const [title, ruleKeys] = MORE[key] || [key.replace(/_/g, " "), []];
    ruleKeys.forEach(([x]) => beside.add(x));
    parts.push(figure(`imp-${key}-figure`, title, [dataTable(`imp-${key}`, columnsOf(rows),
      [...rows].sort((a, b) => (a.rank ?? 0) - (b.rank ?? 0)))],
    rulesBox(rules, ruleKeys, `rules of ${key}`)));
  }
  const rest = Object.keys(rules).filter((x) => !beside.has(x) && !SHARED.includes(x));
  parts.push(el("details", { class: "imported-shared" }, el("summary", { text: "Which events " +
    "are kernels, and how they are merged (every figure above)" }),
  rulesBox(rules, [...SHARED, ...rest].map((x) => [x, x.replace(/_/g, " ")]), "shared rules")));
  section.replaceChildren(...parts);
  try {
    if (temporal.length) await temporalChart(tChart, temporal);
    else emptyChart(tChart, "no GPU kernels in these traces");
    if (types.length) await typesChart(kChart, types);
    else emptyChart(kChart, "no GPU kernels in these traces");
  } catch (e) {
    section.append(el("p", { class: "error", role: "alert", text: `chart: ${e.message || e}` }));
  }
  section.dataset.ready = "1";
}
