// A sweep (/sweeps/{id}): its members in a sortable table with their key figures, measured
// (the run's analysis headline, as the runs table shows them) next to predicted (jobs.theory,
// taken at submit), the reason an invalid member was not launched, and a parallel-coordinates
// plot of the varying fields against the figures. Refreshes while any member is active.
import { api } from "./api.js";
import { emptyChart, plot } from "./charts.js";
import { $, el, esc, fmtDate, statusBadge } from "./dom.js";
import { axisUnit, fmt, fmtBytes, fmtPct, fmtTime } from "./units.js";

const sweepId = decodeURIComponent(location.pathname.split("/").pop());
const state = { sort: "index", dir: 1, sweep: null };
const ACTIVE = ["queued", "running"];

// leaf path -> value of an overrides object ("parallel.zero_stage": 2)
function leaves(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    const path = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) leaves(v, path, out);
    else out[path] = v;
  }
  return out;
}

const meas = (k) => (m) => m.run?.measured?.[k] ?? null;
const pred = (k) => (m) => m.predicted?.[k] ?? null;
const overridesText = (m) => Object.entries(leaves(m.overrides))
  .map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ") || "(base)";
const reason = (m) => (m.errors ? m.errors.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`)
  .join("; ") : m.run?.error || "");
const pct = (v) => fmtPct(v, true);

// One column per figure; predicted beside measured.
const COLUMNS = [
  { key: "index", label: "#", value: (m) => m.index },
  { key: "status", label: "status", value: (m) => m.status, cell: (m) => statusBadge(m.status) },
  { key: "overrides", label: "overrides", value: overridesText },
  { key: "run", label: "run", value: (m) => m.run_id || "",
    cell: (m) => (m.run_id ? el("a", { href: `/runs/${encodeURIComponent(m.run_id)}`,
      text: m.run_id }) : "–") },
  { key: "strategy", label: "strategy", value: (m) => m.run?.strategy ?? null },
  { key: "world_size", label: "world", value: (m) => m.run?.world_size ?? null },
  { key: "step_time_s", label: "step time", value: meas("step_time_s"), fmt: fmtTime },
  { key: "pred_step_time_s", label: "step time (pred.)", value: pred("step_time_s"),
    fmt: fmtTime },
  { key: "tokens_per_s", label: "tokens/s", value: meas("tokens_per_s"),
    fmt: (v) => fmt(v, "tok/s") },
  { key: "peak_memory_bytes", label: "peak mem / rank", value: meas("peak_memory_bytes"),
    fmt: fmtBytes },
  { key: "pred_peak_memory_bytes", label: "peak mem / rank (pred.)",
    value: pred("peak_memory_bytes"), fmt: fmtBytes },
  { key: "exposed_comm_s", label: "exposed comm", value: meas("exposed_comm_s"), fmt: fmtTime },
  { key: "comm_bytes_per_rank", label: "sent / rank / step", value: meas("comm_bytes_per_rank"),
    fmt: fmtBytes },
  { key: "pred_comm_bytes_per_rank", label: "sent / rank / step (pred.)",
    value: pred("comm_bytes_per_rank"), fmt: fmtBytes },
  { key: "bubble_fraction", label: "bubble", value: meas("bubble_fraction"), fmt: pct },
  { key: "pred_bubble_fraction", label: "bubble (pred.)", value: pred("bubble_fraction"),
    fmt: pct },
  { key: "reason", label: "not launched because / error", value: reason },
];

function compare(a, b) {
  if (a === b) return 0;
  if (a === null || a === "") return 1; // empty cells last, either direction
  if (b === null || b === "") return -1;
  const d = typeof a === "number" && typeof b === "number" ? a - b
    : String(a).localeCompare(String(b));
  return d * state.dir;
}

function renderTable() {
  const col = COLUMNS.find((c) => c.key === state.sort);
  const rows = [...state.sweep.members].sort((x, y) => compare(col.value(x), col.value(y))
    || x.index - y.index);
  const head = el("tr", {}, COLUMNS.map((c) => el("th", { dataset: { sort: c.key,
    dir: c.key === state.sort ? (state.dir > 0 ? "asc" : "desc") : "" },
  onclick: () => { state.dir = state.sort === c.key ? -state.dir : 1; state.sort = c.key;
    renderTable(); } }, c.label)));
  const body = rows.map((m) => el("tr", { dataset: { index: m.index, status: m.status } },
    COLUMNS.map((c) => el("td", { dataset: { col: c.key } }, c.cell ? c.cell(m)
      : c.fmt ? c.fmt(c.value(m)) : String(c.value(m) ?? "–")))));
  $("#sweep-members").replaceChildren(el("thead", {}, head), el("tbody", {}, body));
}

// "parallel.zero_stage" -> "zero stage (parallel)": the axis names a field as a person would
export function readable(path) {
  const parts = path.split(".");
  const leaf = parts.pop().replace(/_/g, " ");
  return parts.length ? `${leaf} (${parts.join(" ")})` : leaf;
}

// A parcoords dimension of a varied field: a tick per value, labelled as typed; a member that
// leaves the field to the base reads "base" (never "null"). Text is escaped for Plotly.
function fieldDimension(label, values) {
  const shown = values.map((v) => (v === null || v === undefined ? "base"
    : typeof v === "string" ? v : JSON.stringify(v)));
  const nums = values.every((v) => typeof v === "number");
  const cats = nums ? [...new Set(values)].sort((x, y) => x - y)
    : [...new Set(shown)].sort();
  if (nums && cats.length > 12) return { label: esc(label), values };
  return { label: esc(label), values: nums ? values : shown.map((v) => cats.indexOf(v)),
    tickvals: nums ? cats : cats.map((_, i) => i),
    ticktext: (nums ? cats.map((v) => String(v)) : cats).map(esc),
    range: nums ? [Math.min(...cats), Math.max(...cats)] : [0, Math.max(cats.length - 1, 1)] };
}

// A measured or predicted figure, in one unit chosen for its values ("step time (ms)")
function figureDimension(label, values, unit) {
  const u = axisUnit(values, unit);
  return { label: esc(u.title(label)), values: values.map((v) => v / u.div), tickformat: ".3~g" };
}

const FIGURE_DIMS = [["step_time_s", "step time", "s"], ["tokens_per_s", "throughput", "tok/s"],
  ["peak_memory_bytes", "peak mem / rank", "B"], ["exposed_comm_s", "exposed comm", "s"]];

async function renderPlot() {
  const div = $("#sweep-parcoords");
  const launched = state.sweep.members.filter((m) => m.run_id);
  const done = launched.filter((m) => meas("step_time_s")(m) !== null);
  const rows = done.length ? done : launched;
  if (!rows.length) { emptyChart(div, "no launched member"); return; }
  const flat = rows.map((m) => leaves(m.overrides));
  const keys = [...new Set(flat.flatMap(Object.keys))].filter((k) => new Set(flat.map((f) =>
    JSON.stringify(f[k] ?? null))).size > 1);
  const dims = keys.map((k) => fieldDimension(readable(k), flat.map((f) => f[k] ?? null)));
  const predMem = rows.map((m) => pred("peak_memory_bytes")(m));
  if (predMem.every((v) => v !== null)) {
    dims.push(figureDimension("peak mem / rank, predicted", predMem, "B"));
  }
  for (const [f, label, unit] of FIGURE_DIMS) {
    const vals = rows.map((m) => meas(f)(m));
    if (vals.every((v) => v !== null)) dims.push(figureDimension(label, vals, unit));
  }
  const steps = rows.map((m) => meas("step_time_s")(m) ?? 0);
  const su = axisUnit(steps, "s");
  await plot(div, [{ type: "parcoords", dimensions: dims, labelangle: 0,
    labelfont: { size: 12 }, tickfont: { size: 11 },
    line: { color: steps.map((v) => v / su.div), colorscale: "Viridis",
      showscale: done.length > 0, colorbar: { title: { text: su.title("step time") } } } }],
  { title: { text: done.length ? "Members with measured figures (colour: step time)" :
    "Members (measured figures appear as runs finish)" },
  margin: { l: 110, r: 130, t: 90, b: 30 } });
}

const ms = (v) => (v === null || v === undefined ? "–" : fmtTime(v));
const signedPct = (v) => (v === null || v === undefined ? "–"
  : `${v >= 0 ? "+" : ""}${v.toFixed(1)} %`);
const TERMS = ["compute", "bubble", "comm", "step"];

// The ranking re-stated with measured figures (the API's `calibration`,
// jobs.theory.calibration.restate): only for sweeps launched from the advisor.
function renderCalibration() {
  const cal = state.sweep.calibration;
  const sec = $("#sweep-calibration");
  sec.hidden = !cal;
  if (!cal) return;
  // "not yet" only where waiting helps: a sweep of 2 never reaches the 3 the rank
  // correlation needs, and equal step times make it undefined however many there are
  $("#calib-spearman").textContent = cal.spearman !== null
    ? `Spearman's rank correlation, predicted vs measured step time, over ${cal.n} members: `
      + cal.spearman.toFixed(3)
    : cal.rows.length < 3 ? `Spearman's rank correlation needs ≥ 3 members; this sweep has ` +
      `${cal.rows.length}: the ranking is compared term by term only`
      : cal.n < 3 ? `Spearman's rank correlation: not yet (${cal.n} of ${cal.rows.length} ` +
        "members measured; 3 needed)"
        : "Spearman's rank correlation: undefined (the predicted or the measured step times " +
          "are all equal)";
  const th = (t) => el("th", {}, t);
  $("#calib-terms").replaceChildren(
    el("thead", {}, el("tr", {}, ["term", "members", "mean error (pred − meas)",
      "mean |error|", "mean |error| %"].map(th))),
    el("tbody", {}, TERMS.map((t) => {
      const e = cal.terms[t];
      return el("tr", { dataset: { term: t } }, [t, String(e.members), ms(e.mean_error_s),
        ms(e.mean_abs_error_s), e.mean_abs_error_pct === null ? "–"
          : `${e.mean_abs_error_pct.toFixed(1)} %`].map((v) => el("td", {}, v)));
    })));
  const heads = ["measured rank", "predicted rank", "member"];
  for (const t of TERMS) heads.push(`${t} pred.`, `${t} meas.`, `${t} error`);
  heads.push("idle (meas.)");
  $("#calib-rows").replaceChildren(
    el("thead", {}, el("tr", {}, heads.map(th))),
    el("tbody", {}, cal.rows.map((r) => el("tr", { dataset: { index: r.index } }, [
      r.measured_rank ?? "–", r.predicted_rank ?? "–", r.label,
      ...TERMS.flatMap((t) => [ms(r.terms[t].predicted_s), ms(r.terms[t].measured_s),
        signedPct(r.terms[t].error_pct)]),
      ms(r.idle_s)].map((v) => el("td", {}, String(v)))))));
}

async function load() {
  try { state.sweep = await api.sweep(sweepId); } catch (e) {
    $("#sweep-error").textContent = e.message; return;
  }
  const s = state.sweep;
  $("#sweep-name").textContent = s.name;
  document.title = `${s.name} · sweep · paralab`;
  $("#sweep-status").replaceChildren(statusBadge(s.status));
  const c = Object.entries(s.counts).filter(([k]) => k !== "total").map(([k, n]) => `${n} ${k}`);
  $("#sweep-meta").textContent = `${s.id} · ${s.owner} · ${fmtDate(s.created_at)} · `
    + `${s.counts.total} members: ${c.join(", ")}`;
  $("#sweep-cancel").hidden = !(s.can_modify && ACTIVE.includes(s.status));
  renderTable();
  renderCalibration();
  await renderPlot();
  if (ACTIVE.includes(s.status)) setTimeout(load, 3000);
}

$("#sweep-cancel").addEventListener("click", async () => {
  try { await api.cancelSweep(sweepId); } catch (e) { $("#sweep-error").textContent = e.message; }
  load();
});
load();
