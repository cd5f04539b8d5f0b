// New run: a form generated from the spec's field documentation (GET /api/spec), presets,
// clone-and-edit (?clone=ID), and a live prediction panel (predict.js) that also reports
// invalid combinations inline before submit.
import { api, formatErrors } from "./api.js";
import { $, el, fmtBytes } from "./dom.js";
import { boundErrors, renderLimits } from "./limits.js";
import { WHATIF_INPUTS, renderPrediction, whatIfAssumptions } from "./predict.js";
import { readScript, scriptControl, scriptExtras } from "./new_script.js";

const SECTIONS = [["", "Job"], ["model", "Model"], ["parallel", "Parallel layout"],
  ["train", "Training"], ["trace", "Tracing"], ["runtime", "Runtime"],
  ["collective", "Collective sweep"], ["compute", "Compute calibration"], ["script", "Script"]];
const SKIP = new Set(["version", "name", "faults"]); // faults: their own fieldset below
let fields = {};
let faultExamples = {};
let presets = [];
let spec = {};
let base = {}; // the preset / cloned spec, to highlight what the user changed
let timer = null;
let seq = 0;
let valid = false;
let limits = null; // the caller's quotas and usage (GET /api/users/{name}/limits)
let ready = false; // the spec's fields, presets and the starting spec are loaded
// The inputs that are on the page before the form has loaded and that the load fills (name,
// tags, notes, device memory): a user types into them while the preset is still on its way
// (1-6 s on a busy host), so one the user edited is never overwritten by what loads later,
// nor by a preset picked afterwards (issue 37). "Edited" is a value other than the one the
// page last put there (else the HTML's own): that also holds for what was typed before this
// module ran, which no event listener of it could have seen.
const filled = {};
function setUnlessTouched(id, value) {
  const node = $(`#${id}`);
  if (node.value !== (filled[id] ?? node.defaultValue)) return; // the user's
  node.value = filled[id] = String(value);
}

const getPath = (obj, path) => path.split(".").reduce((o, k) => (o == null ? o : o[k]), obj);
function setPath(obj, path, value) {
  const parts = path.split(".");
  let o = obj;
  for (const k of parts.slice(0, -1)) o = o[k] ??= {};
  o[parts[parts.length - 1]] = value;
}

function input(path, doc) {
  const id = `f-${path.replace(/\./g, "-")}`;
  const value = getPath(spec, path);
  let control = scriptControl(path, value, id); // the script's list / object fields
  if (control) { /* new_script.js */ } else if (doc.type === "tuple") {
    control = el("div", { class: "checks", id });
    for (const c of doc.choices || []) {
      const box = el("input", { type: "checkbox", value: c, dataset: { path } });
      box.checked = (value || []).includes(c);
      control.append(el("label", {}, box, ` ${c}`));
    }
  } else if (doc.choices) {
    control = el("select", { id, dataset: { path } },
      ...doc.choices.map((c) => el("option", { value: c, text: String(c) })));
    control.value = value;
  } else if (doc.type === "bool") {
    control = el("input", { id, type: "checkbox", dataset: { path } });
    control.checked = Boolean(value);
  } else if (doc.type === "int" || doc.type === "float") {
    control = el("input", { id, type: "number", step: doc.type === "int" ? 1 : "any",
      min: doc.ge, max: doc.le, value, dataset: { path } });
  } else {
    control = el("input", { id, value: value ?? "", maxlength: 200, dataset: { path } });
  }
  if (control.setAttribute) { // the field's message is its description (read with the field)
    control.setAttribute("aria-describedby", `${id}-msg`);
    control.setAttribute("aria-invalid", "false");
  }
  const wrap = el("div", { class: "field", dataset: { field: path }, title: doc.doc },
    el("label", { for: id, text: path.split(".").pop() }), control,
    el("div", { class: "msg", id: `${id}-msg`, "aria-live": "polite" }), ...scriptExtras(path, id));
  return wrap;
}

function readControl(node) {
  const path = node.dataset.path;
  const doc = fields[path];
  if (node.dataset.parse) return readScript(node);
  if (doc.type === "tuple") {
    return [...document.querySelectorAll(`input[data-path="${path}"]`)]
      .filter((b) => b.checked).map((b) => b.value);
  }
  if (doc.type === "bool") return node.checked;
  if (doc.type === "int") return node.value === "" ? null : Number.parseInt(node.value, 10);
  if (doc.type === "float") return node.value === "" ? null : Number(node.value);
  return node.value;
}

function buildForm() {
  const box = $("#fields");
  box.replaceChildren();
  for (const [prefix, title] of SECTIONS) {
    const paths = Object.keys(fields).filter((p) => !SKIP.has(p) &&
      (prefix ? p.startsWith(prefix + ".") : !p.includes(".")));
    if (!paths.length) continue;
    box.append(el("fieldset", { dataset: { section: prefix || "job" } },
      el("legend", { text: title }), el("div", { class: "msg error", dataset: { sectionMsg: prefix } }),
      el("div", { class: "fields" }, ...paths.map((p) => input(p, fields[p])))));
  }
  box.append(faultsFieldset());
  box.addEventListener("input", onEdit);
  box.addEventListener("change", onEdit);
  refreshSections();
}

// Injected faults (docs/faults.md): the spec's `faults` list as JSON, and one button per
// example that appends it. Errors at faults.<i>.<field> are shown under the list.
function faultsFieldset() {
  const area = el("textarea", { id: "f-faults", rows: 3, cols: 60, spellcheck: "false",
    "aria-describedby": "f-faults-msg", placeholder: "[] — no faults" });
  area.value = JSON.stringify(spec.faults || []);
  area.addEventListener("input", () => {
    try {
      const v = JSON.parse(area.value || "[]");
      spec.faults = v;
      $("#f-faults-msg").textContent = "";
    } catch {
      $("#f-faults-msg").textContent = "faults: not valid JSON (a list of {kind, ranks, step, …})";
      return;
    }
    schedulePredict();
  });
  const buttons = Object.entries(faultExamples).map(([key, ex]) => el("button", {
    type: "button", class: "small", dataset: { fault: key }, text: ex.title,
    onclick: () => {
      spec.faults = [...(Array.isArray(spec.faults) ? spec.faults : []), ex.fault];
      area.value = JSON.stringify(spec.faults);
      $("#f-faults-msg").textContent = "";
      schedulePredict();
    } }));
  return el("fieldset", { dataset: { section: "faults" } }, el("legend", { text: "Faults" }),
    el("p", { class: "muted small", text: "Make the run go wrong on purpose, to see how " +
      "paralab diagnoses it (runtime.hang_timeout_s decides when a run counts as hung)." }),
    el("div", { class: "examples" }, ...buttons), area,
    el("div", { class: "msg error", id: "f-faults-msg", "aria-live": "polite" }));
}

function onEdit(ev) {
  const node = ev.target.closest("[data-path]");
  if (!node) return;
  setPath(spec, node.dataset.path, readControl(node));
  if (node.dataset.path === "kind") refreshSections();
  markChanged();
  schedulePredict();
}

// The sections a kind ignores (jobs/spec.py: a sweep has no model; a calibration times one
// layer of `model` with its `compute` settings, on every rank).
const IGNORED = {
  collective_bench: ["model", "parallel", "train", "trace", "faults", "compute", "script"],
  compute_bench: ["parallel", "train", "trace", "faults", "collective", "script"],
  // the user's own script (docs/scripts.md): runtime and trace apply, the script decides the rest
  script: ["model", "parallel", "train", "faults", "collective", "compute"],
};

function refreshSections() {
  const ignored = IGNORED[spec.kind] ?? ["collective", "compute", "script"];
  for (const fs of document.querySelectorAll("fieldset[data-section]")) {
    fs.hidden = ignored.includes(fs.dataset.section);
  }
}

function markChanged() {
  for (const f of document.querySelectorAll(".field[data-field]")) {
    const path = f.dataset.field;
    f.classList.toggle("changed",
      JSON.stringify(getPath(spec, path)) !== JSON.stringify(getPath(base, path)));
  }
}

function showErrors(errors) {
  for (const f of document.querySelectorAll(".field")) {
    f.classList.remove("invalid");
    f.querySelector(".msg").textContent = "";
    f.querySelector("[aria-invalid]")?.setAttribute("aria-invalid", "false");
  }
  for (const m of document.querySelectorAll("[data-section-msg]")) m.textContent = "";
  if ($("#f-faults-msg")) $("#f-faults-msg").textContent = "";
  const general = [];
  for (const e of errors) {
    const loc = (e.loc || []).filter((x) => x !== "body" && x !== "spec");
    const path = loc.join(".");
    const field = document.querySelector(`.field[data-field="${CSS.escape(path)}"]`);
    const section = document.querySelector(`[data-section-msg="${CSS.escape(path)}"]`);
    if (path === "faults" || path.startsWith("faults.")) {
      const m = $("#f-faults-msg");
      if (m) m.textContent += (m.textContent ? "\n" : "") + `${path}: ${e.msg}`;
    } else if (field) {
      field.classList.add("invalid");
      field.querySelector("[aria-invalid]")?.setAttribute("aria-invalid", "true");
      const msg = field.querySelector(".msg"); // a field may break several rules: say each
      msg.textContent = msg.textContent ? `${msg.textContent}; ${e.msg}` : e.msg;
    } else if (section) {
      section.textContent += (section.textContent ? "\n" : "") + e.msg;
    } else {
      general.push(`${path || "spec"}: ${e.msg}`);
    }
  }
  $("#form-error").textContent = errors.length
    ? `Not valid yet (${errors.length}):\n` + errors.map((e) =>
      `• ${(e.loc || []).filter((x) => x !== "body" && x !== "spec").join(".")}: ${e.msg}`)
      .join("\n")
    : general.join("\n");
}

// The errors of the prediction plus those of the bounds; true when there are none.
function showAll(errors) {
  const all = [...errors, ...boundErrors(limits, (p) => getPath(spec, p) ?? fields[p]?.default)];
  showErrors(all);
  return all.length === 0;
}

async function loadLimits() {
  try {
    limits = await api.limits((await api.me()).username);
  } catch {
    return; // the form works without them; the server checks the bounds at submit
  }
  renderLimits(limits);
  schedulePredict();
}

function schedulePredict() {
  clearTimeout(timer);
  $("#pred-status").textContent = "updating…";
  timer = setTimeout(predictNow, 250);
}

async function predictNow() {
  const mine = ++seq;
  const own = { ...spec, name: $("#name").value || "run" };
  const assumptions = whatIfAssumptions();
  try {
    const pred = await api.predict(own, assumptions);
    if (mine !== seq) return;
    valid = showAll([]);
    $("#prediction").classList.remove("stale");
    $("#pred-status").textContent = "";
    renderPrediction(pred, Number($("#device-gb").value) * 1e9);
    renderTraceSize(pred.trace);
  } catch (e) {
    if (mine !== seq) return;
    const detail = e.status === 422 && Array.isArray(e.detail) ? e.detail : [];
    if (detail.length && detail.every((x) => x.loc?.[1] === "assumptions")) {
      // the spec parsed (its errors come first): only the panel's what-if is wrong
      valid = showAll([]);
      $("#pred-status").textContent = "what-if: " + detail.map((x) =>
        `${x.loc[x.loc.length - 1]} ${x.msg}`).join("; ");
      $("#submit").disabled = !valid;
      return;
    }
    valid = showAll(e.status === 422 && Array.isArray(e.detail) ? e.detail : []) &&
      e.status !== 422;
    $("#prediction").classList.add("stale");
    $("#pred-status").textContent = e.status === 422 ? "fix the highlighted fields"
      : `prediction unavailable: ${e.message}`;
  }
  $("#submit").disabled = !valid;
}

// The predicted trace size of the spec's `trace` section (jobs.trace_schedule.predicted_trace,
// served by POST /api/predict): traced steps, records and bytes, a lower bound where the
// collectives are not predicted.
function renderTraceSize(t) {
  const box = $("#pred-trace");
  box.hidden = !t;
  if (!t) return;
  const ge = t.lower_bound ? "≥ " : "";
  box.dataset.records = String(t.records);
  box.dataset.bytes = String(t.bytes);
  box.dataset.tracedSteps = t.traced_steps;
  box.textContent = `Trace: ${t.traced_step_count} of ${t.steps} steps traced in detail ` +
    `(${t.traced_steps || "none"}; level ${t.level}), ${ge}${t.records.toLocaleString()} records, ` +
    `${ge}${fmtBytes(t.bytes)} over all ranks` + (t.records_per_traced_step === null ? ""
    : ` · ${ge}${t.records_per_traced_step} records per traced step and rank`) +
    "; every step keeps its loss and step time" + (t.schedule ? ` · schedule: ${t.schedule}` : "");
  box.dataset.schedule = t.schedule || "";
}

function usePreset(name) {
  const p = presets.find((x) => x.name === name);
  if (!p) return;
  spec = structuredClone(p.spec);
  base = structuredClone(p.spec);
  setUnlessTouched("name", p.name);
  $("#preset-title").textContent = p.title + (p.available ? "" : " (not available yet)");
  buildForm();
  if (limits) renderLimits(limits);
  markChanged();
  schedulePredict();
}

async function init() {
  const params = new URLSearchParams(location.search);
  // first: a submit (Enter) before the form has loaded must not send the page's native GET
  $("#new-run").addEventListener("submit", submit);
  const [doc, pres, workers] = await Promise.all([api.specFields(), api.presets(),
    api.workers().catch(() => [])]);
  fields = doc.fields;
  faultExamples = doc.fault_examples || {};
  presets = pres;
  const mem = workers.flatMap((w) => w.devices || []).map((d) => d.memory_bytes).find(Boolean);
  if (mem) setUnlessTouched("device-gb", (mem / 1e9).toFixed(1));
  const sel = $("#preset");
  sel.append(el("option", { value: "", text: "— custom —" }));
  for (const p of presets) {
    sel.append(el("option", { value: p.name, disabled: !p.available,
      text: `${p.name} — ${p.title}${p.available ? "" : " (not available)"}` }));
  }
  sel.addEventListener("change", () => usePreset(sel.value));
  $("#device-gb").addEventListener("input", schedulePredict);
  for (const sel of Object.values(WHATIF_INPUTS)) $(sel)?.addEventListener("input", schedulePredict);
  $("#name").addEventListener("input", schedulePredict);
  const clone = params.get("clone");
  if (clone) {
    const run = await api.run(clone);
    spec = structuredClone(run.spec);
    base = structuredClone(run.spec);
    sel.value = "";
    setUnlessTouched("name", `${run.name} (clone)`);
    setUnlessTouched("tags", run.tags.join(", "));
    setUnlessTouched("notes", run.notes || "");
    $("#form-title").textContent = `Clone of ${run.name}`;
    buildForm();
    if (limits) renderLimits(limits);
    schedulePredict();
  } else {
    const name = params.get("preset") || "ddp";
    sel.value = name;
    usePreset(name);
  }
  if (params.get("queue")) {
    setPath(spec, "runtime.queue", params.get("queue"));
    const q = $("#f-runtime-queue");
    if (q) q.value = params.get("queue");
  }
  ready = true;
  $("#form-loading").hidden = true;
  loadLimits();
}

async function submit(ev) {
  ev.preventDefault();
  if (!ready) return; // Enter in the name field before the form has loaded: nothing to send
  const btn = $("#submit");
  btn.disabled = true;
  const body = { ...spec, name: $("#name").value.trim() || "run",
    tags: $("#tags").value.split(",").map((t) => t.trim()).filter(Boolean),
    notes: $("#notes").value };
  try {
    const run = await api.submit(body);
    location.href = `/runs/${encodeURIComponent(run.id)}`;
  } catch (e) {
    if (e.status === 422 && Array.isArray(e.detail)) showErrors(e.detail);
    else $("#form-error").textContent = formatErrors(e.detail) || e.message;
    btn.disabled = false;
  }
}

init().catch((e) => {
  $("#form-loading").hidden = true;
  $("#form-error").textContent = e.message;
});
