// The sweep builder on /sweeps: a base (a preset, or an existing run's spec) and grid axes, each
// a spec field picked from the spec's own field list (GET /api/spec: the list the new-run form
// is built from) with its values. The member count and the server's verdict on every member
// (POST /api/sweep-checks: POST /api/sweeps's checks, nothing stored) show before launch;
// launching submits the same body and opens the sweep's page.
import { api, formatErrors } from "./api.js";
import { $, el } from "./dom.js";

// not sweepable: the schema version, the name (the sweep names its members), the fault list
// and the other list-valued fields (a grid value replaces a field; lists would need an editor)
const SKIP = new Set(["version", "name", "faults"]);
let fields = {};
let presets = [];
let baseSpec = null; // the chosen base's full spec (placeholders show its values)
let baseBody = null; // what goes into the body's `base`
let timer = null;
let seq = 0;
let checked = null; // the body the last successful validation was for

const getPath = (obj, path) => path.split(".").reduce((o, k) => (o == null ? o : o[k]), obj);

// "2, 4" -> [2, 4] by the field's type; [values, problem]
export function parseValues(doc, text) {
  const parts = text.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (!parts.length) return [[], "give one or more values, comma-separated"];
  const out = [];
  for (const p of parts) {
    let v = p;
    if (doc.type === "int") {
      v = Number(p);
      if (!Number.isInteger(v)) return [[], `${p}: not a whole number`];
    } else if (doc.type === "float") {
      v = Number(p);
      if (!Number.isFinite(v)) return [[], `${p}: not a number`];
    } else if (doc.type === "bool") {
      if (!["true", "false"].includes(p.toLowerCase())) return [[], `${p}: true or false`];
      v = p.toLowerCase() === "true";
    }
    if (doc.choices && !doc.choices.includes(v)) {
      return [[], `${p}: one of ${doc.choices.join(", ")}`];
    }
    if (out.some((x) => x === v)) return [[], `${p}: given twice`];
    out.push(v);
  }
  return [out, ""];
}

function fieldOptions() {
  return [el("option", { value: "", text: "choose a spec field" }),
    ...Object.entries(fields).filter(([k, d]) => !SKIP.has(k) && !["tuple", "dict"].includes(d.type))
      .map(([k, d]) => el("option", { value: k, text: k, title: d.doc }))];
}

function hint(row) {
  const path = row.querySelector(".sb-field").value;
  const doc = fields[path];
  const box = row.querySelector(".sb-values");
  if (!doc) {
    box.placeholder = "values, comma-separated";
    row.querySelector(".sb-doc").textContent = "";
    return;
  }
  const now = baseSpec ? getPath(baseSpec, path) : undefined;
  box.placeholder = doc.choices ? doc.choices.join(", ") : doc.type === "bool" ? "true, false"
    : `e.g. ${now ?? doc.default}, …`;
  row.querySelector(".sb-doc").textContent = `${doc.doc}${now !== undefined
    ? ` (base: ${JSON.stringify(now)})` : ""}`;
}

function addAxis(path = "", values = "") {
  const row = el("div", { class: "sb-axis" },
    el("select", { class: "sb-field", "aria-label": "field to vary" }, ...fieldOptions()),
    el("input", { class: "sb-values", "aria-label": "values, comma-separated", value: values }),
    el("button", { type: "button", class: "small sb-remove", text: "remove",
      onclick: () => { row.remove(); changed(); } }),
    el("div", { class: "sb-doc muted" }),
    el("div", { class: "sb-msg error", role: "alert" }));
  row.querySelector(".sb-field").value = path;
  row.querySelector(".sb-field").addEventListener("change", () => { hint(row); changed(); });
  row.querySelector(".sb-values").addEventListener("input", changed);
  $("#sb-axes").append(row);
  hint(row);
}

// the body, or null with each axis's problem shown beside it
function body() {
  let ok = Boolean(baseBody);
  const grid = {};
  for (const row of document.querySelectorAll("#sb-axes .sb-axis")) {
    const path = row.querySelector(".sb-field").value;
    const msg = row.querySelector(".sb-msg");
    msg.textContent = "";
    if (!path) { // a new, untouched axis is no error yet
      if (row.querySelector(".sb-values").value.trim()) msg.textContent = "choose a field";
      ok = false;
      continue;
    }
    if (grid[path]) { msg.textContent = `${path} is already an axis`; ok = false; continue; }
    const [vals, problem] = parseValues(fields[path], row.querySelector(".sb-values").value);
    if (problem) { msg.textContent = problem; ok = false; continue; }
    grid[path] = vals;
  }
  if (!Object.keys(grid).length) ok = false;
  const n = Object.values(grid).reduce((p, v) => p * v.length, 1);
  $("#sb-count").textContent = Object.keys(grid).length
    ? `${n} member${n === 1 ? "" : "s"} (${Object.entries(grid).map(([k, v]) => `${v.length} ${k}`)
      .join(" × ")})` : "choose a field and its values";
  $("#sb-count").dataset.members = String(Object.keys(grid).length ? n : 0);
  if (!ok) return null;
  const name = $("#sb-name").value.trim();
  return { ...(name ? { name } : {}), base: baseBody, grid };
}

function changed() {
  checked = null;
  $("#sb-launch").disabled = true;
  $("#sb-status").textContent = "";
  $("#sb-errors").replaceChildren();
  clearTimeout(timer);
  if (!body()) return;
  $("#sb-status").textContent = "checking…";
  timer = setTimeout(check, 300);
}

// a 422's detail as lines: one per member (["body", "members", i, ...]), one per other error
function errorItems(errs) {
  const lines = new Map();
  for (const e of errs) {
    const loc = (e.loc || []).slice(1);
    const member = loc[0] === "members" && Number.isInteger(loc[1]) ? loc[1] : null;
    const key = member === null ? `other ${lines.size}` : `member ${member}`;
    const text = `${(member === null ? loc : loc.slice(2)).join(".")}: ${e.msg}`;
    lines.set(key, lines.has(key) ? `${lines.get(key)}; ${text}` : `${key}: ${text}`);
  }
  return [...lines.values()].map((text) => el("li", { text }));
}

async function check() {
  const b = body();
  if (!b) return;
  const mine = ++seq;
  let out;
  try { out = await api.validateSweep(b); } catch (e) {
    if (mine !== seq) return;
    $("#sb-status").textContent = "the server refuses this sweep:";
    $("#sb-errors").replaceChildren(...(Array.isArray(e.detail) ? errorItems(e.detail)
      : [el("li", { text: formatErrors(e.detail) })]));
    return;
  }
  if (mine !== seq) return;
  checked = b;
  $("#sb-count").dataset.valid = String(out.valid);
  $("#sb-status").textContent = out.valid === out.members
    ? `all ${out.members} members valid` : `${out.valid} of ${out.members} members valid; `
      + "the others would not be launched:";
  // one line per refused member: its axis values, then each of its errors
  $("#sb-errors").replaceChildren(...out.items.filter((m) => m.errors).map((m) => el("li", {
    dataset: { member: m.index }, text: `member ${m.index} (${Object.keys(b.grid).map((k) =>
      `${k}=${JSON.stringify(getPath(m.overrides, k))}`).join(", ")}): ${m.errors.map((e) =>
      `${(e.loc || []).slice(1).join(".")}: ${e.msg}`).join("; ")}` })));
  $("#sb-launch").disabled = false;
}

async function pickBase() {
  const kind = $("#sb-base-kind").value;
  $("#sb-preset").hidden = kind !== "preset";
  $("#sb-run").hidden = kind !== "run";
  $("#sb-base-msg").textContent = "";
  baseSpec = null;
  baseBody = null;
  if (kind === "preset") {
    const p = presets.find((x) => x.name === $("#sb-preset").value);
    if (p) { baseSpec = p.spec; baseBody = { preset: p.name }; }
  } else {
    const id = $("#sb-run").value.trim();
    if (id) {
      try {
        const r = await api.run(id);
        baseSpec = r.spec;
        const { name: _name, ...spec } = r.spec; // the members are named by the sweep
        baseBody = spec;
        $("#sb-base-msg").textContent =
          `base: ${r.name} (${r.strategy}, world size ${r.world_size})`;
      } catch (e) { $("#sb-base-msg").textContent = e.message; }
    }
  }
  document.querySelectorAll("#sb-axes .sb-axis").forEach(hint);
  changed();
}

async function launch(ev) {
  ev.preventDefault();
  if (!checked) return;
  $("#sb-launch").disabled = true;
  $("#sb-status").textContent = "launching…";
  try {
    const s = await api.submitSweep(checked);
    location.href = `/sweeps/${encodeURIComponent(s.id)}`;
  } catch (e) {
    $("#sb-status").textContent = "";
    $("#sb-errors").replaceChildren(...(Array.isArray(e.detail) ? errorItems(e.detail)
      : [el("li", { text: e.message })]));
    $("#sb-launch").disabled = false;
  }
}

export async function mountBuilder() {
  try {
    const [doc, pres] = await Promise.all([api.specFields(), api.presets()]);
    fields = doc.fields;
    presets = pres.filter((p) => p.available !== false);
  } catch (e) { $("#sb-status").textContent = e.message; return; }
  $("#sb-preset").replaceChildren(...presets.map((p) => el("option", { value: p.name,
    text: `${p.name} — ${p.title}` })));
  $("#sb-preset").value = presets.some((p) => p.name === "ddp") ? "ddp" : presets[0]?.name;
  const from = new URLSearchParams(location.search).get("base_run");
  if (from) { $("#sb-base-kind").value = "run"; $("#sb-run").value = from; }
  $("#sb-base-kind").addEventListener("change", pickBase);
  $("#sb-preset").addEventListener("change", pickBase);
  $("#sb-run").addEventListener("change", pickBase);
  $("#sb-name").addEventListener("input", changed);
  $("#sb-add-axis").addEventListener("click", () => { addAxis(); changed(); });
  $("#sb-form").addEventListener("submit", launch);
  addAxis();
  await pickBase();
  $("#sb-form").dataset.ready = "1";
}
