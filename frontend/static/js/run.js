// The run page: live status and log stream (SSE) with a rank filter, metric cards, downloads,
// and the charts (Gantt, memory, communication, curves) once the run has a trace.
import { api } from "./api.js";
import { mountComm } from "./comm.js";
import { mountCurves } from "./curves.js";
import { $, degrees, el, fmtBytes, fmtDate, fmtPct, fmtSeconds, headline, statusBadge }
  from "./dom.js";
import { mountGantt } from "./gantt.js";
import { memoryTotals, mountMemory } from "./memory.js";
import { mountSweepChart } from "./sweeps.js";

const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const FINISHED = ["succeeded", "failed", "cancelled", "timed_out"];
let run = null;
let stream = null;
let chartsLoaded = false;
let logLines = [];
const extra = {};

function renderHead() {
  document.title = `${run.name} · paralab`;
  $("#run-title").textContent = run.name;
  $("#run-status").replaceChildren(statusBadge(run.status));
  $("#run-meta").textContent = [`${run.id}`, run.strategy, `${degrees(run)} = ${run.world_size} ranks`,
    `owner ${run.owner}`, `queue ${run.queue}`, run.worker_host ? `on ${run.worker_host}` : null,
    `created ${fmtDate(run.created_at)}`, run.finished_at ? `finished ${fmtDate(run.finished_at)}`
      : null, run.tags.length ? `tags: ${run.tags.join(", ")}` : null].filter(Boolean).join(" · ");
  $("#run-error").textContent = run.error || "";
  $("#clone-link").href = `/new?clone=${encodeURIComponent(run.id)}`;
  const cancel = $("#cancel-btn");
  cancel.hidden = FINISHED.includes(run.status) || run.can_modify === false;
  renderCards();
}

function card(label, value, sub) {
  return el("div", { class: "card", dataset: { card: label } }, el("div", { class: "label", text: label }),
    el("div", { class: "value", text: value }), sub ? el("div", { class: "sub", text: sub }) : null);
}

// How the layers were cut into stages (summary.pipeline.partition), e.g. " · layers 2/3 (measured)"
function partitionNote() {
  const part = run.summary?.pipeline?.partition;
  if (!part || !Array.isArray(part.layers_per_stage)) return "";
  return ` · layers ${part.layers_per_stage.map(Number).join("/")} (${String(part.mode)})`;
}

function renderCards() {
  const h = headline(run);
  const peak = h.peak_memory_bytes ?? (extra.memory ? Math.max(...memoryTotals(extra.memory)
    .map((t) => t.measured)) : null);
  const b = extra.breakdown?.mean;
  const bubble = h.bubble_fraction ?? (b && run.pp > 1 && b.step_s ? b.bubble_s / b.step_s : null);
  const ranks = extra.comm?.ranks || [];
  const ov = ranks.filter((r) => r.overlap_pct !== null);
  const overlap = h.overlap_pct ?? (ov.length ? ov.reduce((a, r) => a + r.overlap_pct, 0) / ov.length
    : null);
  $("#cards").replaceChildren(
    card("step time", fmtSeconds(h.step_time_s), "mean per step"),
    card("throughput", h.tokens_per_s ? `${Math.round(h.tokens_per_s).toLocaleString()} tok/s` : "–"),
    card("peak memory", fmtBytes(peak), "busiest rank, model state + activations"),
    card("bubble", fmtPct(bubble, true), run.pp > 1 ? `idle in pipeline steps${partitionNote()}`
      : "no pipeline"),
    card("overlap", fmtPct(overlap), "comm hidden under compute"),
    card("exposed comm", fmtSeconds(b?.exposed_comm_s), "mean per step and rank"));
}

async function renderDownloads() {
  const box = $("#downloads");
  const links = [
    ["Perfetto trace", api.exportUrl(run.id, "perfetto")],
    ["analysis CSV", api.exportUrl(run.id, "csv")],
    ["analysis JSON", api.exportUrl(run.id, "json")],
    ...["step_rank", "memory", "collectives", "axis_bytes", "rank_comm"].flatMap((t) => [
      [`${t}.csv`, api.tableUrl(run.id, t, "csv")], [`${t}.json`, api.tableUrl(run.id, t, "json")]]),
  ];
  let files = [];
  try { files = await api.files(run.id); } catch { files = []; }
  box.replaceChildren(el("strong", { text: "Downloads: " }),
    ...links.map(([t, href]) => el("a", { href, text: t, download: "" })),
    ...files.map((f) => el("a", { href: api.fileUrl(run.id, f.path), text: f.path, download: "" })));
}

function appendLog(line) {
  logLines.push(line);
  if (logLines.length > 5000) logLines = logLines.slice(-4000);
  const pre = $("#log");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
  pre.textContent = logLines.join("\n");
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function connect() {
  if (stream) stream.close();
  logLines = [];
  $("#log").textContent = "";
  const rank = $("#log-rank").value;
  stream = api.logStream(run.id, rank === "" ? undefined : Number(rank));
  $("#log-info").textContent = "live";
  let buffer = [];
  let flush = null;
  stream.onmessage = (ev) => {
    buffer.push(ev.data);
    if (!flush) flush = setTimeout(() => { buffer.forEach(appendLog); buffer = []; flush = null; }, 100);
  };
  stream.addEventListener("status", async (ev) => {
    if (ev.data !== run.status) { run = await api.run(run.id); renderHead(); }
  });
  stream.addEventListener("end", async () => {
    stream.close();
    $("#log-info").textContent = "run finished";
    run = await api.run(run.id);
    renderHead();
    loadCharts();
  });
}

async function loadCharts() {
  if (chartsLoaded) return;
  chartsLoaded = true;
  renderDownloads();
  if (run.kind === "collective_bench") {
    $("#memory-section").hidden = true;
    $("#curves-section").hidden = true;
    await mountSweepChart($("#comm-busbw"), [run.id]);
  }
  await mountGantt(run.id, run.pp > 1); // first: the other views reuse its parsed trace
  const jobs = [
    run.kind === "train" ? mountMemory(run.id, $("#memory-chart"), $("#memory-table"))
      .then((rows) => { extra.memory = rows; }) : null,
    run.kind === "train" ? mountComm(run.id).then((c) => { extra.comm = c; }) : null,
    api.breakdown(run.id).then((b) => { extra.breakdown = b; }).catch(() => null),
    run.kind === "train" ? mountCurves(run, $("#loss-chart"), $("#throughput-chart")) : null,
  ];
  await Promise.allSettled(jobs);
  renderCards();
  document.body.dataset.chartsReady = "1";
}

async function init() {
  try { run = await api.run(runId); } catch (e) {
    $("#run-error").textContent = e.status === 404 ? `no run ${runId}` : e.message;
    return;
  }
  renderHead();
  const sel = $("#log-rank");
  for (let r = 0; r < run.world_size; r++) sel.append(el("option", { value: r, text: `rank ${r}` }));
  sel.addEventListener("change", connect);
  $("#cancel-btn").addEventListener("click", async () => {
    $("#cancel-btn").disabled = true;
    try { run = await api.cancel(run.id); renderHead(); } catch (e) { $("#run-error").textContent = e.message; }
  });
  connect();
  if (FINISHED.includes(run.status)) loadCharts();
}

init();
