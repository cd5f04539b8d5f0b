// The import page (/import): PyTorch profiler traces made elsewhere become a run of kind
// `import` (POST /api/imports, multipart: files, name, tags, notes, allow_missing_ranks).
// The upload goes through XMLHttpRequest, not fetch: its upload events give the progress bar
// its bytes sent / total; once the body is sent the server checks and analyses the traces
// ("analysing…") and answers the run (201: go to its page) or a 422 whose errors each name a
// field (loc ["body", field, …]): each is shown next to that field, the files' under the file
// list (the file it names marked), and nothing typed or chosen is lost. User strings reach the
// page only through textContent (dom.js `el`).
import { formatErrors } from "./api.js";
import { $, el, fmtBytes } from "./dom.js";

const FIELDS = ["name", "tags", "notes", "files", "allow_missing_ranks"];
let chosen = []; // the File objects to upload, in the order chosen
let busy = false;

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function renderFiles() {
  const list = $("#file-list");
  list.replaceChildren(...chosen.map((f) => el("li", { dataset: { name: f.name,
    size: String(f.size) } },
  el("span", { class: "file-name", text: f.name }), " ",
  el("span", { class: "muted file-size", text: fmtBytes(f.size) }), " ",
  el("button", { type: "button", class: "small", text: "remove", "aria-label": `remove ${f.name}`,
    disabled: busy, onclick: () => {
      chosen = chosen.filter((c) => c !== f);
      setError("files", []);
      renderFiles();
    } }))));
  const total = chosen.reduce((s, f) => s + f.size, 0);
  $("#file-total").textContent = chosen.length
    ? `${plural(chosen.length, "file")}, ${fmtBytes(total)} in all` : "no file chosen yet";
  $("#file-total").dataset.bytes = String(total);
}

// A file chosen again (same name, size and date) is listed once.
function addFiles(files) {
  for (const f of files) {
    if (!chosen.some((c) => c.name === f.name && c.size === f.size &&
        c.lastModified === f.lastModified)) chosen.push(f);
  }
  setError("files", []);
  renderFiles();
}

function setError(field, msgs) {
  const box = $(`#err-${field}`);
  if (!box) return;
  box.textContent = msgs.join("\n");
  box.closest(".field").classList.toggle("invalid", msgs.length > 0);
  if (field === "files") {
    // the files a message names ("rank-1.json: …", an archive's "x.zip:member: …") are marked
    for (const li of $("#file-list").children) {
      const name = li.dataset.name;
      li.classList.toggle("bad", msgs.some((m) => m.startsWith(`${name}:`) ||
        m.includes(` ${name}:`) || m.includes(`(also ${name})`) || m.includes(`but ${name} `)));
    }
  }
}

function clearErrors() {
  for (const f of FIELDS) setError(f, []);
  $("#form-error").textContent = "";
}

// Each error next to the field its loc names; the "files: " a message starts with is the
// field's name again (backend Invalid), dropped there. Anything else goes under the form.
function showErrors(detail) {
  const by = {};
  const other = [];
  for (const e of Array.isArray(detail) ? detail : [{ msg: formatErrors(detail) }]) {
    const field = e?.loc?.[0] === "body" ? e.loc[1] : undefined;
    const msg = String(e?.msg ?? e);
    if (FIELDS.includes(field)) {
      (by[field] ||= []).push(msg.startsWith(`${field}: `) ? msg.slice(field.length + 2) : msg);
    } else other.push(e?.loc ? `${e.loc.join(".")}: ${msg}` : msg);
  }
  for (const f of FIELDS) setError(f, by[f] || []);
  $("#form-error").textContent = other.join("\n");
  const first = FIELDS.find((f) => by[f]);
  if (first) ($(`#imp-${first === "allow_missing_ranks" ? "missing" : first}`))?.focus();
}

function showProgress(loaded, total, phase) {
  const bar = $("#upload-progress");
  $("#progress-box").hidden = false;
  bar.max = Math.max(total, 1);
  bar.value = Math.min(loaded, bar.max);
  bar.dataset.loaded = String(loaded);
  bar.dataset.total = String(total);
  $("#progress-box").dataset.phase = phase;
  const pct = total ? Math.floor((100 * loaded) / total) : 0;
  const sent = `${fmtBytes(loaded)} of ${fmtBytes(total)} sent (${pct} %)`;
  $("#progress-text").textContent = phase === "uploading" ? `uploading: ${sent}`
    : phase === "analysing" ? `${sent} · analysing…` : `${sent} · ${phase}`;
}

function formData() {
  const form = new FormData();
  form.append("name", $("#imp-name").value.trim());
  for (const t of $("#imp-tags").value.split(",").map((x) => x.trim()).filter(Boolean)) {
    form.append("tags", t);
  }
  form.append("notes", $("#imp-notes").value);
  form.append("allow_missing_ranks", $("#imp-missing").checked ? "true" : "false");
  for (const f of chosen) form.append("files", f, f.name);
  return form;
}

// POST the form; resolves {status, body} (status 0: the connection failed).
function upload(form, bytes) {
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/api/imports");
    xhr.setRequestHeader("Accept", "application/json");
    let last = { loaded: 0, total: bytes };
    xhr.upload.addEventListener("progress", (ev) => {
      last = { loaded: ev.loaded, total: ev.lengthComputable ? ev.total : bytes };
      showProgress(last.loaded, last.total, "uploading");
    });
    // the body is sent: the server now checks, converts and analyses the traces
    xhr.upload.addEventListener("load", () => showProgress(last.total, last.total, "analysing"));
    xhr.addEventListener("load", () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { body = xhr.responseText; }
      resolve({ status: xhr.status, body, sent: last });
    });
    xhr.addEventListener("error", () => resolve({ status: 0, body: null, sent: last }));
    xhr.addEventListener("abort", () => resolve({ status: 0, body: null, sent: last }));
    showProgress(0, bytes, "uploading");
    xhr.send(form);
  });
}

function setBusy(on) {
  busy = on;
  $("#submit").disabled = on;
  $("#submit").textContent = on ? "Importing…" : "Import";
  $("#imp-files").disabled = on;
  renderFiles();
}

async function submit(ev) {
  ev.preventDefault();
  if (busy) return;
  clearErrors();
  const local = {};
  if (!$("#imp-name").value.trim()) local.name = ["required: the run's name"];
  if (!chosen.length) {
    local.files = ["choose one trace file per rank (.json / .json.gz) or one .zip / .tar.gz " +
      "of the trace folder"];
  }
  if (Object.keys(local).length) {
    showErrors(Object.entries(local).flatMap(([f, msgs]) => msgs.map((msg) =>
      ({ loc: ["body", f], msg }))));
    return;
  }
  setBusy(true);
  const bytes = chosen.reduce((s, f) => s + f.size, 0);
  const r = await upload(formData(), bytes);
  if (r.status === 201 && r.body?.id) {
    showProgress(r.sent.total, r.sent.total, "imported, opening the run…");
    document.body.dataset.imported = r.body.id;
    location.href = `/runs/${encodeURIComponent(r.body.id)}`;
    return;
  }
  setBusy(false);
  if (r.status === 401) {
    location.href = `/login?next=${encodeURIComponent(location.pathname)}`;
    return;
  }
  showProgress(r.sent.loaded, r.sent.total, r.status === 0 ? "the connection failed"
    : `refused (HTTP ${r.status})`);
  if (r.status === 0) {
    $("#form-error").textContent = "The upload failed (no answer from the server): " +
      "nothing was imported; try again.";
  } else if (r.body && typeof r.body === "object" && "detail" in r.body) {
    showErrors(r.body.detail);
  } else $("#form-error").textContent = `HTTP ${r.status}: ${String(r.body || "").slice(0, 500)}`;
  document.body.dataset.importErrors = String(Date.now());
}

function init() {
  const zone = $("#drop-zone");
  const input = $("#imp-files");
  input.addEventListener("change", () => {
    addFiles([...input.files]);
    input.value = ""; // the list is the selection: choosing again adds to it
  });
  for (const type of ["dragenter", "dragover"]) {
    zone.addEventListener(type, (ev) => {
      ev.preventDefault();
      if (!busy) zone.classList.add("over");
    });
  }
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (ev) => {
    ev.preventDefault();
    zone.classList.remove("over");
    if (!busy && ev.dataTransfer?.files?.length) addFiles([...ev.dataTransfer.files]);
  });
  // a file dropped beside the zone must not make the browser leave the page to open it
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (ev) => { if (!zone.contains(ev.target)) ev.preventDefault(); });
  }
  for (const f of ["name", "tags", "notes"]) {
    $(`#imp-${f}`).addEventListener("input", () => setError(f, []));
  }
  $("#imp-missing").addEventListener("change", () => setError("allow_missing_ranks", []));
  $("#import-form").addEventListener("submit", submit);
  renderFiles();
  document.body.dataset.ready = "1";
}

init();
