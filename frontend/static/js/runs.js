// The runs page: the shared history with filters, text search, sort, cursor paging, selection
// for compare and cancel. Filters and sort live in the URL, so a filtered view can be shared.
import { api } from "./api.js";
import { $, allDegrees, el, fmtBytes, fmtDate, fmtPct, fmtSeconds, statusBadge } from "./dom.js";
import { fmt, parseQuantity, rateUnit } from "./units.js";

const tbody = $("#runs tbody");
const selected = new Map(); // id -> name
const params = new URLSearchParams(location.search);
const state = {
  q: params.get("q") || "", status: params.get("status") || "",
  strategy: params.get("strategy") || "", owner: params.get("owner") || "",
  tag: params.get("tag") || "", sort: params.get("sort") || "-created_at",
  max_peak_memory_bytes: params.get("max_peak_memory_bytes") || "",
  limit: Number(params.get("limit")) || 50,
};
let cursors = [null]; // cursor of each page visited; the last one is the current page
// Sorting by a performance figure ranks succeeded runs only (unless a status is picked): a
// failed, hung, cancelled or timed-out run's figures cover the part that ran, and would sit
// among the good runs' (a hung run's step time, a crash's short duration). The note says so.
const PERFORMANCE = new Set(["step_time_s", "tokens_per_s", "peak_memory_bytes", "exposed_comm_s",
  "bubble_fraction", "overlap_pct", "final_loss", "duration_s"]);
let nextCursor = null;

function syncUrl() {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(state)) {
    if (v && !(k === "sort" && v === "-created_at") && !(k === "limit" && v === 50)) p.set(k, v);
  }
  history.replaceState(null, "", p.toString() ? `/?${p}` : "/");
}

function cell(content, cls) {
  const td = el("td", { class: cls });
  td.append(content instanceof Node ? content : document.createTextNode(content ?? ""));
  return td;
}

function row(r) {
  const check = el("input", { type: "checkbox", "aria-label": `select run ${r.id}`,
    class: "pick", dataset: { runId: r.id } });
  check.checked = selected.has(r.id);
  check.addEventListener("change", () => {
    if (check.checked) selected.set(r.id, r.name); else selected.delete(r.id);
    updateCompare();
  });
  const name = el("a", { href: `/runs/${encodeURIComponent(r.id)}`, class: "run-name",
    text: r.name });
  const tags = el("span", {}, ...r.tags.map((t) => el("span", { class: "tag", text: t })));
  const actions = el("td");
  // can_modify is the server's answer for this user (own run, or admin); absent = local mode.
  if ((r.status === "queued" || r.status === "running") && r.can_modify !== false) {
    actions.append(el("button", { type: "button", class: "small cancel", text: "cancel",
      onclick: async (ev) => {
        if (!window.confirm(`Cancel run ${r.name}? It stops now; the steps it completed stay.`)) {
          return;
        }
        ev.target.disabled = true;
        try { await api.cancel(r.id); } catch (e) { $("#list-error").textContent = e.message; }
        load();
      } }));
  }
  const tr = el("tr", { dataset: { runId: r.id, status: r.status } },
    cell(check), cell(el("span", {}, name, el("span", { class: "muted id", text: ` ${r.id}` }))),
    cell(statusBadge(r.status)), cell(r.strategy), cell(`${allDegrees(r)} (${r.world_size})`),
    cell(r.owner), cell(tags), cell(fmtSeconds(r.step_time_s), "num"),
    cell(fmt(r.tokens_per_s, rateUnit(r.metrics)), "num"), cell(fmtBytes(r.peak_memory_bytes), "num"),
    cell(fmtSeconds(r.exposed_comm_s), "num"), cell(fmtPct(r.bubble_fraction, true), "num"),
    cell(fmtPct(r.overlap_pct), "num"), cell(fmt(r.final_loss, "", { sig: 4 }), "num"),
    cell(fmtSeconds(r.duration_s), "num"), cell(fmtDate(r.created_at)), actions);
  return tr;
}

function updateCompare() {
  const btn = $("#compare-btn");
  const n = selected.size;
  btn.disabled = n < 2 || n > 4;
  btn.textContent = n ? `Compare selected (${n})` : "Compare selected";
  btn.title = "select 2 to 4 runs";
}

// the status the list asks for: the one picked, else "succeeded" under a performance sort
function sortNote(query) {
  const key = state.sort.replace("-", "");
  let note = $("#sort-note");
  if (!note) {
    note = el("p", { id: "sort-note", class: "muted" });
    $("#runs").closest(".table-wrap").before(note);
  }
  const only = PERFORMANCE.has(key) && !state.status;
  if (only) query.status = "succeeded";
  const th = document.querySelector(`th[data-sort="${key}"]`);
  note.hidden = !only;
  note.textContent = only ? `Sorted by ${(th?.textContent || key).toLowerCase()}: succeeded ` +
    "runs only (a failed, hung or cancelled run's figures cover only the part that ran); " +
    "pick a status to list others." : "";
  return query;
}

async function load() {
  const cursor = cursors[cursors.length - 1];
  const query = sortNote({ ...state, cursor });
  const t0 = performance.now();
  try {
    const page = await api.runs(query);
    tbody.replaceChildren(...page.items.map(row));
    if (!page.items.length) {
      tbody.append(el("tr", {}, el("td", { colspan: 13, class: "muted", text: "no runs" })));
    }
    nextCursor = page.next_cursor;
    $("#list-error").textContent = "";
    $("#page-info").textContent = `page ${cursors.length} · ${page.items.length} runs · ` +
      `${Math.round(performance.now() - t0)} ms`;
  } catch (e) {
    $("#list-error").textContent = e.message;
  }
  $("#next").disabled = !nextCursor;
  $("#prev").disabled = $("#first").disabled = cursors.length < 2;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    const key = th.dataset.sort;
    th.classList.toggle("sorted", state.sort.replace("-", "") === key);
    th.dataset.dir = state.sort === key ? "asc" : state.sort === `-${key}` ? "desc" : "";
  }
}

function restart() {
  cursors = [null];
  syncUrl();
  load();
}

async function init() {
  const strategies = new Set(["single"]);
  try { for (const p of await api.presets()) strategies.add(p.strategy); } catch { /* offline */ }
  const sel = $("#f-strategy");
  for (const s of [...strategies].sort()) sel.append(el("option", { value: s, text: s }));
  $("#q").value = state.q;
  $("#f-status").value = state.status;
  sel.value = state.strategy;
  $("#f-owner").value = state.owner;
  $("#f-tag").value = state.tag;
  $("#f-mem-max").value = state.max_peak_memory_bytes ? fmtBytes(Number(state.max_peak_memory_bytes)) : "";
  $("#limit").value = String(state.limit);
  $("#filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const memInput = $("#f-mem-max");
    const mem = memInput.value.trim() ? parseQuantity(memInput.value, "B") : "";
    memInput.setAttribute("aria-invalid", String(Number.isNaN(mem)));
    if (Number.isNaN(mem)) {
      $("#list-error").textContent = "peak mem: a size such as 512 MB or 2 GB";
      return;
    }
    $("#list-error").textContent = "";
    state.max_peak_memory_bytes = mem === "" ? "" : String(Math.round(mem));
    Object.assign(state, { q: $("#q").value.trim(), status: $("#f-status").value,
      strategy: sel.value, owner: $("#f-owner").value.trim(), tag: $("#f-tag").value.trim() });
    restart();
  });
  for (const id of ["#f-status", "#f-strategy"]) {
    $(id).addEventListener("change", () => $("#filters").requestSubmit());
  }
  $("#limit").addEventListener("change", () => { state.limit = Number($("#limit").value); restart(); });
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.tabIndex = 0;
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      state.sort = state.sort === `-${key}` ? key : `-${key}`;
      restart();
    });
  }
  $("#next").addEventListener("click", () => { if (nextCursor) { cursors.push(nextCursor); load(); } });
  $("#prev").addEventListener("click", () => { if (cursors.length > 1) { cursors.pop(); load(); } });
  $("#first").addEventListener("click", () => { cursors = [null]; load(); });
  $("#compare-btn").addEventListener("click", () => {
    location.href = `/compare?ids=${[...selected.keys()].map(encodeURIComponent).join(",")}`;
  });
  updateCompare();
  await load();
  setInterval(() => { if (!document.hidden) load(); }, 4000);
}

init();
