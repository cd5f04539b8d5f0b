// The advisor (/advise): model + cluster in, POST /api/advise, the ranked table with its
// breakdown bars (compute, bubble, comm per axis), seed 004's rules and the reasons; "launch
// top k as a sweep" POSTs {name, base, members} to /api/sweeps. Every string from the user or
// the server (the cluster figures' sources too) reaches the page through textContent (dom.js
// el) or esc() in Plotly text.
import { api } from "./api.js";
import { PALETTE, layout, plot } from "./charts.js";
import { $, el, esc, fmtNum } from "./dom.js";

const MODEL = ["layers", "hidden", "heads", "seq_len", "vocab"];
const TIMED = ["t_forward", "t_backward_input", "t_backward_weight"];
let result = null;

const num = (id) => {
  const v = $(`#a-${id}`).value.trim();
  return v === "" ? undefined : Number(v);
};

export function readBody() {
  const preset = $("#a-preset").value;
  const arch = $("#a-arch").value;
  // a preset is its own model (jobs.spec PRESETS); otherwise the explicit shape
  const model = preset ? { preset } : { arch };
  if (!preset) for (const k of MODEL) if (num(k) !== undefined) model[k] = num(k);
  if (!preset && arch === "timed") {
    for (const k of TIMED) if (num(k) !== undefined) model[k] = num(k);
  }
  const cluster = { hosts: num("hosts"), devices_per_host: num("devices_per_host") };
  if (num("memory") !== undefined) cluster.device_memory_bytes = num("memory") * 1e9;
  if (num("intra") !== undefined) cluster.intra_GBps = num("intra");
  if (num("inter") !== undefined) cluster.inter_GBps = num("inter");
  if (num("tflops") !== undefined) cluster.flops = num("tflops") * 1e12;
  const body = { model, global_batch: num("global_batch"), cluster, top: num("top") ?? 20 };
  const queue = $("#a-queue").value.trim();
  if (queue) body.queue = queue;
  return body;
}

function showErrors(errors) {
  for (const f of document.querySelectorAll("#advise-form .field")) {
    f.classList.remove("invalid");
    f.querySelector(".msg").textContent = "";
  }
  const general = [];
  for (const e of errors) {
    const name = (e.loc || []).filter((x) => x !== "body").join(".");
    const field = document.querySelector(`#advise-form .field[data-field="${CSS.escape(name)}"]`);
    if (field) {
      field.classList.add("invalid");
      field.querySelector(".msg").textContent = e.msg;
    } else {
      general.push(`${name || "request"}: ${e.msg}`);
    }
  }
  $("#advise-error").textContent = general.join("\n");
}

function counts(c) {
  const invalid = Object.values(c.invalid).reduce((a, b) => a + b, 0);
  const pruned = Object.values(c.pruned).reduce((a, b) => a + b, 0);
  const reasons = Object.entries({ ...c.pruned, ...c.invalid })
    .sort((a, b) => b[1] - a[1]).slice(0, 4).map(([r, n]) => `${n} × ${r}`).join("; ");
  return `${c.considered} layouts considered: ${c.fitting} fit, ${c.not_fitting} do not fit ` +
    `in memory, ${invalid} refused by the spec validator, ${pruned} pruned by divisibility` +
    (reasons ? ` (${reasons})` : "");
}

async function bars(cands) {
  const labels = cands.map((c) => `#${c.rank} ${c.label}`);
  const axes = [...new Set(cands.flatMap((c) => Object.keys(c.predicted.comm_s)))];
  const trace = (name, ys, color) => ({ type: "bar", orientation: "h", name, y: labels, x: ys,
    marker: { color }, hovertemplate: `${esc(name)}: %{x:.4g} s<br>%{y}<extra></extra>` });
  const data = [
    trace("compute", cands.map((c) => c.predicted.compute_s), PALETTE[0]),
    trace("bubble", cands.map((c) => c.predicted.bubble_s), PALETTE[1]),
    ...axes.map((a, i) => trace(`comm ${a}`, cands.map((c) => c.predicted.comm_s[a] || 0),
      PALETTE[2 + (i % 7)])),
  ];
  const lay = layout("Predicted step time, by term", "seconds", "",
    { barmode: "stack", yaxis: { autorange: "reversed" }, height: 120 + 28 * cands.length });
  lay.yaxis.title = { text: "" };
  await plot($("#advise-bars"), data, lay);
}

// Where the cluster figures came from: given, or measured on the queue (the latest collective
// sweep's bandwidth, the latest compute calibration's FLOP/s), as the server names them.
export function sources(c) {
  const rows = [];
  if (c.flops !== undefined) {
    rows.push(["flops", `compute rate ${Number(c.flops / 1e9).toPrecision(4)} GFLOP/s per ` +
      `device: ${c.flops_source ?? "given"}`]);
  }
  rows.push(["bandwidth", `bandwidth intra ${fmtNum(c.intra_GBps, 3)} GB/s, inter ` +
    `${fmtNum(c.inter_GBps, 3)} GB/s: ${c.bandwidth_source ?? "given"}`]);
  return rows.map(([k, t]) => el("div", { dataset: { source: k }, text: t }));
}

function ruleCell(rules) {
  return el("td", { class: "rules" }, rules.filter((r) => r.status !== "n/a").map((r) =>
    el("div", { class: `rule rule-${r.status}`, dataset: { rule: r.rule, status: r.status },
      title: r.why, text: `${r.status === "follows" ? "✓" : "✗"} ${r.rule}: ${r.why}` })));
}

function table(cands) {
  const head = el("tr", {}, ["#", "layout", "step", "compute", "bubble", "comm", "memory/rank",
    "seed 004 rules", "why", "neighbours ruled out"].map((h) => el("th", { text: h })));
  const rows = cands.map((c) => {
    const p = c.predicted;
    const comm = Object.values(p.comm_s).reduce((a, b) => a + b, 0);
    const nb = c.neighbours.filter((n) => n.status !== "slower").slice(0, 4);
    return el("tr", { dataset: { rank: c.rank, label: c.label } },
      el("td", { text: String(c.rank) }), el("td", { class: "mono", text: c.label }),
      el("td", { text: `${fmtNum(p.step_s, 4)} s` }), el("td", { text: fmtNum(p.compute_s, 4) }),
      el("td", { text: fmtNum(p.bubble_s, 4) }), el("td", { text: fmtNum(comm, 4) }),
      el("td", { text: `${fmtNum(p.memory_bytes / 1e9, 2)} GB` }), ruleCell(c.rules),
      el("td", { class: "why" }, c.why.map((w) => el("div", { text: w }))),
      el("td", { class: "why" }, nb.map((n) => el("div", { text: `${n.change}: ${n.reason}` }))));
  });
  $("#advise-table").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
}

// The sweep body: candidate 1's spec as the base, each of the top k as a member's full spec.
// What `spec` changes in `base`, as a sweep member's overrides (deep-merged back by the
// service, docs/sweeps.md): the sweep table then shows what differs, not whole specs.
function overrides(base, spec) {
  const out = {};
  for (const [k, v] of Object.entries(spec)) {
    const b = base?.[k];
    if (v && typeof v === "object" && !Array.isArray(v) && b && typeof b === "object") {
      const sub = overrides(b, v);
      if (Object.keys(sub).length) out[k] = sub;
    } else if (JSON.stringify(v) !== JSON.stringify(b)) out[k] = v;
  }
  return out;
}

// `cluster`: the bandwidths and rate the ranking used, so every member stores the advisor's
// breakdown and the sweep page can re-state the ranking as measured (docs/sweeps.md)
export function sweepBody(cands, k, name, cluster) {
  const top = cands.slice(0, k);
  const body = { name, base: top[0].spec, members: top.map((c) => overrides(top[0].spec,
    c.spec)) };
  if (cluster) {
    body.cluster = { intra_GBps: cluster.intra_GBps, inter_GBps: cluster.inter_GBps };
    if (cluster.flops) body.cluster.flops = cluster.flops;
  }
  return body;
}

async function advise(ev) {
  ev?.preventDefault();
  showErrors([]);
  $("#advise-counts").textContent = "asking the theory…";
  try {
    result = await api.advise(readBody());
  } catch (e) {
    result = null;
    $("#advise-counts").textContent = "";
    $("#launch-go").disabled = true;
    if (Array.isArray(e.detail)) showErrors(e.detail);
    else $("#advise-error").textContent = e.message;
    return;
  }
  $("#advise-counts").textContent = counts(result.counts);
  $("#advise-conventions").textContent = Object.entries(result.conventions)
    .map(([k, v]) => `${k}: ${v}`).join(" · ");
  $("#advise-sources").replaceChildren(...sources(result.cluster));
  const cands = result.candidates;
  $("#launch-go").disabled = cands.length === 0;
  $("#launch-k").max = String(cands.length);
  if (!cands.length) {
    const nf = result.not_fitting.map((r) => `${r.label}: ${r.reason}`).join("\n");
    $("#advise-table").replaceChildren();
    $("#advise-error").textContent = "no layout fits" + (nf ? `; the closest:\n${nf}` : "");
    return;
  }
  table(cands);
  await bars(cands);
}

async function launch(ev) {
  ev.preventDefault();
  const status = $("#launch-status");
  if (!result?.candidates.length) return;
  const k = Math.max(1, Math.min(Number($("#launch-k").value) || 1, result.candidates.length));
  const body = sweepBody(result.candidates, k, $("#launch-name").value.trim() || "advisor",
    result.cluster);
  status.className = "";
  status.textContent = `launching ${k} runs…`;
  try {
    const sweep = await api.submitSweep(body);
    status.replaceChildren("sweep ", el("a", { href: `/sweeps/${encodeURIComponent(
      sweep.id ?? "")}`, text: String(sweep.id ?? "") }), ` launched with ${k} members`);
  } catch (e) {
    status.className = "error";
    status.textContent = `could not launch the sweep: ${e.message}`;
  }
}

function archChanged() {
  const timed = $("#a-arch").value === "timed";
  for (const f of document.querySelectorAll("#advise-form .field.timed")) f.hidden = !timed;
}

async function init() {
  $("#advise-form").addEventListener("submit", advise);
  $("#launch-form").addEventListener("submit", launch);
  $("#a-arch").addEventListener("change", archChanged);
  archChanged();
  try {
    const presets = await api.presets();
    $("#a-preset").append(...presets.filter((p) => p.spec.kind === "train")
      .map((p) => el("option", { value: p.name, text: `${p.name} — ${p.title}` })));
  } catch (e) {
    $("#advise-error").textContent = `presets: ${e.message}`;
  }
  document.body.dataset.ready = "1";
}

init();
