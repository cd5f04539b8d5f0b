// The advisor (/advise): model + cluster in, POST /api/advise, the ranked table with its
// breakdown bars (compute, bubble, comm per axis), the rules of thumb and the reasons
// (advise_results.js); whether the hardware was measured or assumed, and "launch top k as a
// sweep" (advise_launch.js). Every string from the user or the server reaches the page
// through textContent (dom.js el) or esc() in Plotly text.
import { api } from "./api.js";
import { $, el } from "./dom.js";
import { SPEARMAN_MIN, launchK, renderAssumed, renderKNote, resetLaunch, sweepBody,
  warnFirst } from "./advise_launch.js";
import { bars, counts, modelLine, sources, table } from "./advise_results.js";

const MODEL = ["layers", "hidden", "heads", "seq_len", "vocab"];
const GPT_ONLY = new Set(["heads", "seq_len", "vocab"]); // an mlp / timed model has none
const TIMED = ["t_forward", "t_backward_input", "t_backward_weight"];
let result = null;
let asked = null; // the body `result` answers
let presets = [];
const launchState = { confirmed: false };

const num = (id) => {
  const v = $(`#a-${id}`).value.trim();
  return v === "" ? undefined : Number(v);
};

// The model as the fields show it. A preset is sent with the fields as its overrides: the
// preset brings what the form has no field for (experts, routing), and the answer is for
// the shape on the screen, even after the user edits a field the preset filled.
export function readBody() {
  const preset = $("#a-preset").value;
  const arch = $("#a-arch").value;
  const model = preset ? { preset, arch } : { arch };
  for (const k of MODEL) {
    if (num(k) !== undefined && (arch === "gpt" || !GPT_ONLY.has(k))) model[k] = num(k);
  }
  if (arch === "timed") for (const k of TIMED) if (num(k) !== undefined) model[k] = num(k);
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

// Picking a preset fills the model's fields (and the global batch) with the preset's, so the
// form shows the model the answer will be for; what it has no field for is named beside it.
function fillFromPreset() {
  const p = presets.find((x) => x.name === $("#a-preset").value);
  const extra = $("#a-preset-extra");
  extra.textContent = "";
  if (!p) return;
  const m = p.spec.model || {};
  if ([...$("#a-arch").options].some((o) => o.value === m.arch)) $("#a-arch").value = m.arch;
  for (const k of [...MODEL, ...TIMED]) if (m[k] !== undefined) $(`#a-${k}`).value = String(m[k]);
  if (p.spec.train?.global_batch) $("#a-global_batch").value = String(p.spec.train.global_batch);
  if (m.experts > 0) extra.textContent = `from the preset: ${m.experts} experts, top-${m.top_k}`;
  archChanged();
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

// The search takes from a blink to many seconds (a large cluster, a busy host): say that it
// runs, keep the last answer greyed until the new one replaces it, and refuse a second click.
function busy(on) {
  $("#advise-progress").hidden = !on;
  $("#advise-go").disabled = on;
  $("#advise-results").classList.toggle("stale", on);
  $("#advise-results").setAttribute("aria-busy", String(on));
}

async function advise(ev) {
  ev?.preventDefault();
  showErrors([]);
  busy(true);
  const body = readBody();
  try {
    result = await api.advise(body);
    asked = body;
  } catch (e) {
    result = null;
    $("#advise-counts").textContent = "";
    $("#launch-go").disabled = true;
    if (Array.isArray(e.detail)) showErrors(e.detail);
    else $("#advise-error").textContent = e.message;
    return;
  } finally {
    busy(false);
  }
  resetLaunch(launchState);
  $("#launch-status").textContent = "";
  $("#advise-model").textContent = modelLine(result);
  $("#advise-counts").textContent = counts(result.counts);
  $("#advise-conventions").textContent = Object.entries(result.conventions)
    .map(([k, v]) => `${k}: ${v}`).join(" · ");
  $("#advise-sources").replaceChildren(...sources(result.cluster));
  renderAssumed(result, useMeasured);
  const cands = result.candidates;
  $("#launch-go").disabled = cands.length === 0;
  $("#launch-k").max = String(cands.length);
  renderKNote(result);
  if (!cands.length) {
    const nf = result.not_fitting.map((r) => `${r.label}: ${r.reason}`).join("\n");
    $("#advise-table").replaceChildren();
    $("#advise-error").textContent = "no layout fits" + (nf ? `; the closest:\n${nf}` : "");
    return;
  }
  table(cands);
  await bars(cands);
}

// Empty the typed figures the queue has measured, and ask again: the server fills them in.
function useMeasured(ids) {
  for (const id of ids) $(`#a-${id}`).value = "";
  advise();
}

async function launch(ev) {
  ev.preventDefault();
  const status = $("#launch-status");
  if (!result?.candidates.length) return;
  if (warnFirst(result, launchState)) return;
  const k = launchK(result);
  const body = sweepBody(result.candidates, k, $("#launch-name").value.trim() || "advisor",
    result.cluster, asked?.queue);
  status.className = "";
  status.textContent = `launching ${k} runs…`;
  try {
    const sweep = await api.submitSweep(body);
    status.replaceChildren("sweep ", el("a", { href: `/sweeps/${encodeURIComponent(
      sweep.id ?? "")}`, text: String(sweep.id ?? "") }), ` launched with ${k} members` +
      (k < SPEARMAN_MIN ? ` (fewer than ${SPEARMAN_MIN}: no rank correlation, the terms ` +
        "are compared one by one)" : ""));
  } catch (e) {
    status.className = "error";
    status.textContent = `could not launch the sweep: ${e.message}`;
  }
}

// only the fields of the chosen architecture are shown: the form shows the model it sends
function archChanged() {
  const arch = $("#a-arch").value;
  for (const f of document.querySelectorAll("#advise-form .field.timed, #advise-form .field.gpt")) {
    f.hidden = !f.classList.contains(arch);
  }
}

async function init() {
  $("#advise-form").addEventListener("submit", advise);
  $("#launch-form").addEventListener("submit", launch);
  $("#a-arch").addEventListener("change", archChanged);
  $("#a-preset").addEventListener("change", fillFromPreset);
  $("#launch-k").addEventListener("input", () => renderKNote(result));
  archChanged();
  try {
    presets = (await api.presets()).filter((p) => p.spec.kind === "train");
    $("#a-preset").append(...presets.map((p) => el("option", { value: p.name,
      text: `${p.name} — ${p.title}` })));
  } catch (e) {
    $("#advise-error").textContent = `presets: ${e.message}`;
  }
  document.body.dataset.ready = "1";
}

init();
