// The `script` section of the new-run form (kind `script`, docs/scripts.md): the fields whose
// spec types have no generic control. `script.args` is a list of strings, edited one argument
// per line (never split like a shell would: a line is one argument, spaces and quotes kept);
// `script.env` is {NAME: value}, edited as NAME=value lines; `script.upload` gets a file input
// that uploads the working-directory archive at once (POST /api/uploads, XMLHttpRequest for
// its progress events) and fills the sha256 and the entry's suggestions (the upload's .py
// files). new.js calls scriptControl / scriptExtras while building a field and readScript
// while reading one; everything the user or the server wrote reaches the page as text only.
import { el, fmtBytes } from "./dom.js";

const AREAS = {
  "script.args": { rows: 4, hint: "one argument per line, exactly as the script receives it " +
    "(sys.argv[1:]); no shell splitting or quoting", show: (v) => (v || []).join("\n") },
  "script.env": { rows: 3, hint: "one NAME=value per line",
    show: (v) => Object.entries(v || {}).map(([k, x]) => `${k}=${x}`).join("\n") },
};

const lines = (text) => {
  const out = text.split("\n").map((l) => l.replace(/\r$/, ""));
  while (out.length && out[out.length - 1] === "") out.pop(); // a trailing newline adds none
  return out;
};

// The control of a script field that needs its own (a textarea), else null.
export function scriptControl(path, value, id) {
  const a = AREAS[path];
  if (!a) {
    if (path !== "script.entry") return null;
    return el("input", { id, value: value ?? "", maxlength: 300, list: `${id}-list`,
      spellcheck: "false", dataset: { path } });
  }
  const area = el("textarea", { id, rows: a.rows, cols: 40, spellcheck: "false",
    placeholder: a.hint, dataset: { path, parse: path } });
  area.value = a.show(value);
  return area;
}

// The value of a control made by scriptControl that is not a plain string.
export function readScript(node) {
  const text = node.value;
  if (node.dataset.parse === "script.args") return lines(text);
  const env = {}; // script.env: a line without "=" is a name with an empty value
  for (const l of lines(text)) {
    if (!l.trim()) continue;
    const i = l.indexOf("=");
    env[(i < 0 ? l : l.slice(0, i)).trim()] = i < 0 ? "" : l.slice(i + 1);
  }
  return env;
}

// What follows a script field's control: its hint, the entry's suggestions, the upload's
// file input and status.
export function scriptExtras(path, id) {
  if (AREAS[path]) return [el("div", { class: "muted small hint", text: AREAS[path].hint })];
  if (path === "script.entry") return [el("datalist", { id: `${id}-list` })];
  if (path !== "script.upload") return [];
  const file = el("input", { type: "file", id: `${id}-file`, accept: ".tar.gz,.tgz,.zip",
    "aria-describedby": `${id}-status` });
  const status = el("div", { class: "upload-status small", id: `${id}-status`,
    "aria-live": "polite" });
  file.addEventListener("change", () => {
    if (file.files.length) uploadArchive(file.files[0], id, status);
  });
  return [el("label", { class: "upload-pick", for: `${id}-file`,
    text: "working directory (.tar.gz / .zip)" }), file, status];
}

function setStatus(status, text, error) {
  status.textContent = text;
  status.classList.toggle("error", Boolean(error));
  status.setAttribute("role", error ? "alert" : "status");
}

// Upload the archive; on success set script.upload (an input event, so new.js reads it like a
// typed value) and offer the upload's .py files as entries; a refusal is shown at the field.
function uploadArchive(f, id, status) {
  const form = new FormData();
  form.append("file", f, f.name);
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/api/uploads");
  xhr.setRequestHeader("Accept", "application/json");
  xhr.upload.addEventListener("progress", (ev) => {
    const total = ev.lengthComputable ? ev.total : f.size;
    setStatus(status, `uploading: ${fmtBytes(ev.loaded)} of ${fmtBytes(total)}`);
  });
  xhr.upload.addEventListener("load", () => setStatus(status, "checking the archive…"));
  xhr.addEventListener("load", () => {
    let body = null;
    try { body = JSON.parse(xhr.responseText); } catch { body = xhr.responseText; }
    if (xhr.status === 200 || xhr.status === 201) return uploaded(body, id, status);
    const d = body?.detail ?? body;
    const msg = Array.isArray(d) ? d.map((e) => e.msg).join("; ")
      : (typeof d === "string" && d) || `HTTP ${xhr.status}`;
    status.dataset.state = "error";
    setStatus(status, `upload refused: ${msg}`, true);
  });
  const failed = () => {
    status.dataset.state = "error";
    setStatus(status, "upload failed: no answer from the server", true);
  };
  xhr.addEventListener("error", failed);
  xhr.addEventListener("abort", failed);
  status.dataset.state = "uploading";
  setStatus(status, `uploading: 0 of ${fmtBytes(f.size)}`);
  xhr.send(form);
}

function uploaded(body, id, status) {
  const sha = String(body.sha256 || "");
  const sha256 = document.getElementById(id);
  sha256.value = sha;
  sha256.dispatchEvent(new Event("input", { bubbles: true }));
  status.dataset.state = "done";
  status.dataset.sha256 = sha;
  setStatus(status, `uploaded: ${body.file_count} files, sha256 ${sha.slice(0, 12)}…`);
  offerEntries(sha, body.entries);
}

// The upload's .py files as the entry's suggestions (the POST's answer leaves the member
// list out: GET /api/uploads/{sha256} has it); one script alone fills an empty entry.
async function offerEntries(sha, entries) {
  if (!entries) {
    try {
      const r = await fetch(`/api/uploads/${encodeURIComponent(sha)}`,
        { headers: { Accept: "application/json" } });
      entries = r.ok ? (await r.json()).entries : [];
    } catch {
      entries = []; // the suggestions only: the entry can still be typed
    }
  }
  const py = (entries || []).map(String).filter((e) => e.endsWith(".py"));
  const list = document.getElementById("f-script-entry-list");
  list?.replaceChildren(...py.map((e) => el("option", { value: e })));
  const entry = document.getElementById("f-script-entry");
  if (entry && !entry.value && py.length === 1) { // one script: it is the entry
    entry.value = py[0];
    entry.dispatchEvent(new Event("input", { bubbles: true }));
  }
}
