// The runs page: submit form, live table, log of the selected run. Only textContent is used
// for data, so names and logs are always shown literally.
import { api, formatErrors } from "./api.js";

const tbody = document.querySelector("#runs tbody");
let stream = null;

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text ?? "";
  if (cls) td.className = cls;
  return td;
}

async function loadPresets() {
  const sel = document.getElementById("preset");
  for (const p of await api.presets()) {
    const opt = document.createElement("option");
    opt.value = p.name;
    opt.textContent = `${p.name} — ${p.title}${p.available ? "" : " (not available yet)"}`;
    opt.disabled = !p.available;
    sel.appendChild(opt);
  }
  sel.value = "ddp";
}

async function refresh() {
  const page = await api.runs({ limit: 50 });
  tbody.replaceChildren(...page.items.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.runId = r.id;
    tr.append(cell(r.id), cell(r.name), cell(r.strategy), cell(r.world_size),
      cell(r.status, `status status-${r.status}`), cell(new Date(r.created_at).toLocaleString()));
    const actions = document.createElement("td");
    const show = document.createElement("button");
    show.textContent = "log";
    show.addEventListener("click", () => showRun(r.id, r.name));
    actions.appendChild(show);
    if (r.status === "queued" || r.status === "running") {
      const cancel = document.createElement("button");
      cancel.textContent = "cancel";
      cancel.addEventListener("click", async () => { await api.cancel(r.id); refresh(); });
      actions.appendChild(cancel);
    }
    tr.appendChild(actions);
    return tr;
  }));
}

function showRun(id, name) {
  document.getElementById("run-detail").hidden = false;
  document.getElementById("detail-title").textContent = `Run ${id}: ${name}`;
  const pre = document.getElementById("detail-log");
  pre.textContent = "";
  if (stream) stream.close();
  stream = api.logStream(id);
  stream.onmessage = (ev) => { pre.textContent += ev.data + "\n"; };
  stream.addEventListener("end", () => { stream.close(); refresh(); });
}

document.getElementById("new-run").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const err = document.getElementById("form-error");
  err.textContent = "";
  const spec = { preset: document.getElementById("preset").value,
    train: { steps: Number(document.getElementById("steps").value) } };
  const name = document.getElementById("run-name").value.trim();
  if (name) spec.name = name;
  try {
    const run = await api.submit(spec);
    await refresh();
    showRun(run.id, run.name);
  } catch (e) {
    err.textContent = formatErrors(e.detail);
  }
});

await loadPresets();
await refresh();
setInterval(refresh, 2000);
