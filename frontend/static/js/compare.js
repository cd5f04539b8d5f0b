// Compare 2-4 runs (/compare?ids=a,b[&base=a]): "which is better and why". First the key figures
// side by side with deltas against a chosen baseline, then bytes per mesh axis, memory per rank
// by component, overlaid loss and step-time curves, the runs' timelines one above the other on
// a shared time axis (one steady step each, from its start), and the config diff last. One
// colour per run on every chart. Every figure is a cell of a run's analysis (GET /metrics).
import { headlineOf, stepsLabel, table } from "./analysis.js";
import { api } from "./api.js";
import { COMPONENT_COLORS, emptyChart, layout, plot } from "./charts.js";
import { FIGURES, NOISE_RULE, delta, noiseOf, verdict } from "./compare_figures.js";
import { $, degrees, el, esc, statusBadge } from "./dom.js";
import { axisUnit, fmt, logAxis, rateUnit } from "./units.js";

// run colours: no chart on this page uses these for anything else
export const RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
const params = new URLSearchParams(location.search);
const ids = (params.get("ids") || "").split(",").map((s) => s.trim()).filter(Boolean).slice(0, 4);

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

// The layout columns lead the diff and are always shown: the mesh degrees, expert and context
// parallelism (both carved out of dp: 1 when unused) and the experts a MoE model routes to
// ("none" on a dense model).
export function layoutOf(r) {
  const ep = Number(r.spec?.parallel?.ep || 1);
  const cp = Number(r.spec?.parallel?.cp || 1);
  const experts = Number(r.spec?.model?.experts || 0);
  return { strategy: r.strategy, world_size: r.world_size,
    degrees: degrees(r) + (ep > 1 ? `·ep${ep}` : "") + (cp > 1 ? `·cp${cp}` : ""), ep, cp,
    experts: experts > 0 ? experts : "none", top_k: experts > 0 ? r.spec?.model?.top_k : "–" };
}

function diffTable(runs) {
  // injected faults as one line each (the run's `faults`, jobs/faultspec.describe), not JSON
  const flat = runs.map((r) => ({ ...layoutOf(r), ...flatten({ ...r.spec, faults: undefined }),
    faults: (r.faults || []).join("; ") || "none" }));
  const pinned = new Set(Object.keys(layoutOf(runs[0])));
  const keys = [...new Set(flat.flatMap((f) => Object.keys(f)))];
  const showAll = $("#show-all").checked;
  const rows = [];
  let differing = 0;
  for (const k of keys) {
    const vals = flat.map((f) => JSON.stringify(f[k]));
    const differs = new Set(vals).size > 1;
    if (differs) differing++;
    if (!differs && !showAll && !pinned.has(k)) continue;
    rows.push(el("tr", { class: [differs ? "diff" : "", pinned.has(k) ? "layout" : ""]
      .filter(Boolean).join(" "), dataset: { field: k, differs: String(differs) } },
      el("td", { text: k }), ...flat.map((f) => el("td", { text: show(f[k]) }))));
  }
  $("#config-diff").replaceChildren(
    el("thead", {}, el("tr", {}, el("th", { text: `field (${differing} differ)` }),
      ...runs.map((r) => el("th", {}, el("a", { href: `/runs/${encodeURIComponent(r.id)}`,
        text: label(r) }))))),
    el("tbody", {}, ...rows));
}

// One row per figure: the verdict first (each run against the baseline: better / worse / same
// within noise, coloured, naming both runs), then each run's value with its delta.
function verdictCell(runs, analyses, vals, baseIdx, unit, better, key) {
  const cell = el("td", { class: "verdicts" });
  vals.forEach((v, i) => {
    if (i === baseIdx || v === null || v === undefined) return;
    const base = vals[baseIdx];
    if (base === null || base === undefined) return;
    const [noise, rule] = noiseOf(key, analyses[i], analyses[baseIdx], v, base);
    const [word, limit] = verdict(v, base, better, noise);
    const winner = word === "same" ? "" : runs[word === "better" ? i : baseIdx].id;
    const text = word === "same" ? `same as ${label(runs[baseIdx])} within noise`
      : `${word} than ${label(runs[baseIdx])}`;
    cell.append(el("div", { class: `verdict ${word}`, dataset: { run: runs[i].id, winner,
      verdict: word }, title: `noise: ±${fmt(limit, unit)} (${noise === null ? "no per-step "
      + "spread: 0.5 % rounding only" : rule})` },
    el("span", { class: "swatch", style: `background:${RUN_COLORS[i]}` }),
    el("strong", { text: label(runs[i]) }), ` ${text}`));
  });
  return cell;
}

function keyTable(runs, analyses, baseIdx) {
  const heads = analyses.map(headlineOf);
  const rows = FIGURES.map(([key, name, unit, better, get]) => {
    const vals = runs.map((r, i) => get(r, heads[i], analyses[i]));
    if (vals.every((v) => v === null || v === undefined)) return null;
    const vcell = verdictCell(runs, analyses, vals, baseIdx, unit, better, key);
    return el("tr", { dataset: { figure: key } }, el("td", { text: name }), vcell,
      ...vals.map((v, i) => {
        const same = vcell.querySelector(`[data-run="${CSS.escape(runs[i].id)}"]`)
          ?.dataset.verdict === "same";
        const [text, cls] = i === baseIdx ? ["baseline", ""]
          : delta(v, vals[baseIdx], unit, better, key, same);
        return el("td", { class: "num", dataset: { value: v ?? "" } },
          el("div", { text: fmt(v, unit === "tok/s" ? rateUnit(heads[i]) : unit) }),
          el("div", { class: `delta ${cls}`, text: same && text !== "same"
            ? `${text} (within noise)` : text }));
      }));
  }).filter(Boolean);
  const steps = heads.map((h) => stepsLabel(h));
  $("#cmp-caption").textContent = "Medians and means over each run's steady steps ("
    + runs.map((r, i) => `${r.name}: ${steps[i]}`).join("; ") + "); verdicts and deltas "
    + `against the baseline, ${label(runs[baseIdx])}.`;
  $("#cmp-noise p").textContent = NOISE_RULE;
  $("#cmp-table").replaceChildren(
    el("thead", {}, el("tr", {}, el("th", { text: "figure" }),
      el("th", { text: "verdict (against the baseline)" }), ...runs.map((r, i) =>
        el("th", { class: "num", dataset: { run: r.id } },
          el("span", { class: "swatch", style: `background:${RUN_COLORS[i]}` }),
          el("a", { href: `/runs/${encodeURIComponent(r.id)}`, text: label(r) }), " ",
          statusBadge(r.status),
          el("div", { class: "muted steps", text: steps[i] }))))),
    el("tbody", {}, ...rows));
}

function baseSelect(runs, baseIdx, onChange) {
  const sel = $("#cmp-base");
  sel.replaceChildren(...runs.map((r, i) => el("option", { value: String(i), text: label(r) })));
  sel.value = String(baseIdx);
  sel.onchange = () => onChange(Number(sel.value));
}

async function axisChart(runs, analyses, names) {
  const rows = analyses.map((a) => table(a, "axis_bytes"));
  const axes = [...new Set(rows.flat().map((r) => r.axis))];
  if (!axes.length) { emptyChart($("#cmp-axis"), "no communication"); return; }
  // per run and axis: the busiest rank's bytes sent per step
  const val = (i, ax) => Math.max(0, ...rows[i].filter((r) => r.axis === ax)
    .map((r) => r.bytes_sent_per_step || 0));
  const u = axisUnit(runs.flatMap((_, i) => axes.map((ax) => val(i, ax))), "B");
  await plot($("#cmp-axis"), runs.map((r, i) => ({ type: "bar", name: names[i], x: axes,
    y: axes.map((ax) => val(i, ax) / u.div), marker: { color: RUN_COLORS[i] },
    text: axes.map((ax) => `${names[i]}<br>${esc(ax)}: ${fmt(val(i, ax), "B")} per step`),
    textposition: "none", hovertemplate: "%{text}<extra></extra>" })),
  layout("Bytes sent per step per mesh axis (busiest rank)", "mesh axis", u.title("sent per step"),
    { barmode: "group" }));
}

async function memoryChart(runs, analyses, names) {
  const comps = ["params", "grads", "optimizer", "activations", "recv_buffers", "gathered_unit",
    "comm_buffers"];
  const per = analyses.map((a) => table(a, "memory"));
  const x = [[], []];
  const cells = [];
  runs.forEach((r, i) => {
    const ranks = [...new Set(per[i].map((m) => m.rank))].sort((p, q) => p - q);
    for (const rank of ranks) { x[0].push(names[i]); x[1].push(`rank ${rank}`); cells.push([i, rank]); }
  });
  if (!cells.length) { emptyChart($("#cmp-memory"), "no memory samples"); return; }
  const get = (i, rank, c) => per[i].find((m) => m.rank === rank && m.component === c)?.measured_bytes ?? 0;
  const u = axisUnit(cells.map(([i, rank]) => comps.reduce((s, c) => s + get(i, rank, c), 0)), "B");
  await plot($("#cmp-memory"), comps.map((c) => ({ type: "bar", name: c, x,
    y: cells.map(([i, rank]) => get(i, rank, c) / u.div), marker: { color: COMPONENT_COLORS[c] },
    text: cells.map(([i, rank]) => `${names[i]} rank ${rank}<br>${c}: ${fmt(get(i, rank, c), "B")}`),
    textposition: "none", hovertemplate: "%{text}<extra></extra>" })),
  layout("Peak memory per rank by component (measured)", "run / rank", u.title("memory"),
    { barmode: "stack" }));
}

async function curves(runs, analyses, names) {
  const thr = analyses.map((a) => table(a, "throughput"));
  const loss = thr.map((rows, i) => {
    const pts = rows.filter((x) => x.loss !== null);
    return { type: "scatter", mode: "lines+markers", name: names[i], x: pts.map((x) => x.step),
      y: pts.map((x) => x.loss), line: { color: RUN_COLORS[i] },
      hovertemplate: `${names[i]}<br>step %{x}: %{y:.5g}<extra></extra>` };
  }).filter((t) => t.x.length);
  if (loss.length) await plot($("#cmp-loss"), loss, layout("Loss", "step", "loss"));
  else emptyChart($("#cmp-loss"), "no loss curves");
  // Linear in one unit while the runs are within 20x of each other; beyond that a log axis
  // labelled per decade (no minor-tick digits), the values in seconds.
  const times = thr.flat().map((x) => x.step_s).filter((v) => v > 0);
  const lo = Math.min(...times);
  const hi = Math.max(...times);
  const log = times.length > 0 && hi / lo > 20;
  const u = log ? { div: 1, title: (t) => t } : axisUnit(times, "s");
  const st = thr.map((rows, i) => {
    const pts = rows.filter((x) => x.step_s !== null);
    return { type: "scatter", mode: "lines+markers", name: names[i], x: pts.map((x) => x.step),
      y: pts.map((x) => x.step_s / u.div), line: { color: RUN_COLORS[i] },
      text: pts.map((x) => `${names[i]}<br>step ${x.step}: ${fmt(x.step_s, "s")}`),
      hovertemplate: "%{text}<extra></extra>" };
  }).filter((t) => t.x.length);
  if (st.length) {
    await plot($("#cmp-steps"), st, layout("Step time (slowest rank)", "step", u.title("step time"),
      { yaxis: log ? logAxis(lo, hi, "s") : { rangemode: "tozero" } }));
  } else emptyChart($("#cmp-steps"), "no step times");
}

// One steady step of each run, drawn from its start: compute on the row, comm above.
async function timelines(runs, analyses, names) {
  const data = await Promise.all(runs.map(async (r, i) => {
    const h = headlineOf(analyses[i]);
    const s = h.steady_steps;
    if (!s) return null;
    const step = Math.floor((s[0] + s[1]) / 2);
    try { return { step, g: await api.gantt(r.id, { step, max_spans: 4000 }) }; } catch { return null; }
  }));
  const traces = [];
  const tickvals = [];
  const ticktext = [];
  let y = 0;
  let longest = 0;
  data.forEach((d, i) => {
    if (!d) return;
    const g = d.g;
    const t0 = g.steps.find((x) => x.step === d.step)?.t0_ms ?? g.window.t0_ms;
    longest = Math.max(longest, (g.window.t1_ms - t0) / 1e3);
    // one row per rank (mesh order): its compute lane on the row, its comm lanes just above
    const rowY = new Map(g.rows.map((row, j) => [row.rank, y + j]));
    g.rows.forEach((row, j) => { tickvals.push(y + j); ticktext.push(`${esc(runs[i].name)} · ${esc(row.label)}`); });
    for (const kind of ["compute", "comm"]) {
      const xs = [];
      const ys = [];
      const text = [];
      const sg = g.segments;
      for (let k = 0; k < sg.t0.length; k++) {
        const ch = g.lanes[sg.lane[k]]?.channel || "";
        if (kind === "compute" ? ch !== "compute" : !ch.startsWith("comm ")) continue;
        const yy = rowY.get(sg.rank[k]) + (kind === "comm" ? -0.3 : 0);
        const a = (sg.t0[k] - t0) / 1e3;
        const b = (sg.t1[k] - t0) / 1e3;
        const name = `${esc(g.keys[sg.key[k]])} · ${fmt(b - a, "s")}`;
        xs.push(a, (a + b) / 2, b, null);
        ys.push(yy, yy, yy, null);
        text.push(name, name, name, null);
      }
      const comm = kind === "comm";
      traces.push({ type: "scattergl", mode: "lines", x: xs, y: ys, text,
        name: `${names[i]} ${kind}`, showlegend: !comm,
        line: { color: RUN_COLORS[i], width: comm ? 5 : 12 }, opacity: comm ? 0.55 : 1,
        hovertemplate: "%{text}<extra></extra>" });
    }
    y += g.rows.length + 1;
  });
  if (!traces.length) { emptyChart($("#cmp-timelines"), "no traces"); return; }
  const u = axisUnit([longest], "s");
  for (const t of traces) t.x = t.x.map((v) => (v === null ? null : v / u.div));
  const div = $("#cmp-timelines");
  div.style.height = `${Math.max(260, 26 * y + 90)}px`;
  await plot(div, traces, layout("One steady step of each run, from its start (shared axis)",
    u.title("time since the step began"), "", {
      yaxis: { tickvals, ticktext, autorange: "reversed", zeroline: false, fixedrange: true },
      margin: { l: Math.min(260, Math.round(div.clientWidth * 0.4)) || 260, r: 10, t: 45, b: 60 },
      legend: { orientation: "h", y: -0.25 } }));
  div.dataset.runs = String(data.filter(Boolean).length);
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
  // an id that fails is named inline; the others still compare
  const got = await Promise.allSettled(ids.map((id) => api.run(id)));
  $("#compare-error").replaceChildren(...got.map((g, i) => (g.status === "rejected"
    ? el("div", { class: "bad-id", dataset: { badId: ids[i] },
      text: `${ids[i]}: ${g.reason?.status === 404 ? "no such run" : g.reason?.message}` })
    : null)).filter(Boolean));
  const runs = got.filter((g) => g.status === "fulfilled").map((g) => g.value);
  ids.splice(0, ids.length, ...runs.map((r) => r.id));
  if (runs.length < 2) {
    $("#compare-error").append(el("div", { text: runs.length
      ? `Only ${label(runs[0])} was found: pick at least one more run to compare with.`
      : "None of these runs was found." }));
    return;
  }
  const analyses = await Promise.all(runs.map((r) => api.metrics(r.id).catch(() => null)));
  const names = runs.map((r) => esc(label(r)));
  let baseIdx = Math.max(0, ids.indexOf(params.get("base") || ids[0]));
  const redraw = () => keyTable(runs, analyses, baseIdx);
  baseSelect(runs, baseIdx, (i) => {
    baseIdx = i;
    params.set("base", ids[i]);
    history.replaceState(null, "", `/compare?${params}`);
    redraw();
  });
  redraw();
  diffTable(runs);
  $("#show-all").addEventListener("change", () => diffTable(runs));
  await Promise.allSettled([axisChart(runs, analyses, names), memoryChart(runs, analyses, names),
    curves(runs, analyses, names), timelines(runs, analyses, names)]);
  document.body.dataset.chartsReady = "1";
}

init();
