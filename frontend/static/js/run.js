// The run page: live status and log stream (SSE) with a rank filter, metric cards, downloads,
// and the charts (Gantt, memory, communication, curves) once the run has a trace.
import { headlineOf, rule, stepsLabel } from "./analysis.js";
import { api } from "./api.js";
import { emptyChart } from "./charts.js";
import { mountComm } from "./comm.js";
import { mountCurves } from "./curves.js";
import { mountDiagnosis, mountResume } from "./diagnosis.js";
import { $, allDegrees, el, fmtBytes, fmtDate, fmtPct, fmtSeconds, statusBadge } from "./dom.js";
import { mountGantt } from "./gantt.js";
import { fmtThroughput } from "./units.js";
import { createHealth, plain, WENT_WRONG } from "./health.js";
import { mountHosts } from "./hosts.js";
import { importCards, mountImported } from "./imported.js";
import { mountMemory } from "./memory.js";
import { mountMoe } from "./moe.js";
import { mountSweepChart } from "./sweeps.js";

const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const FINISHED = ["succeeded", "failed", "cancelled", "timed_out", "hung"];
let run = null;
let stream = null;
let chartsLoaded = false;
let logLines = [];
let analysis = null; // GET /metrics: every figure on this page
let gantt = null;
let live = null; // the /live stream while the run goes
let liveBusy = false;
let liveAgain = false;
let liveUpdates = 0;
let reportAwaited = false;
const LIVE_MIN_GAP_MS = 1000;
const health = createHealth($("#run-health"));
const POLL_MS = 5000; // a queued or running run's wait reason and last progress, refetched
// the chart boxes that show a placeholder until the run's first figures arrive
// (the timeline's is its info line: gantt.js draws into #gantt with Plotly directly)
const CHART_BOXES = ["#memory-chart", "#comm-axis", "#comm-busbw", "#comm-overlap", "#loss-chart",
  "#throughput-chart"];
let placeholder = null;

function renderHead() {
  document.title = `${run.name} · paralab`;
  $("#run-title").textContent = run.name;
  $("#run-status").replaceChildren(statusBadge(run.status));
  $("#run-meta").textContent = [`${run.id}`, run.strategy, `${allDegrees(run)} = ${run.world_size} ranks`,
    `owner ${run.owner}`, `queue ${run.queue}`, (run.nnodes || 1) > 1 ? `on ${run.nnodes} hosts`
      : run.worker_host ? `on ${run.worker_host}` : null,
    `created ${fmtDate(run.created_at)}`, run.finished_at ? `finished ${fmtDate(run.finished_at)}`
      : null, run.tags.length ? `tags: ${run.tags.join(", ")}` : null].filter(Boolean).join(" · ");
  // a run that went wrong tells its cause in the health block (the culprit first); the raw
  // error text, which lists every rank in rank order, is not repeated above it
  $("#run-error").textContent = WENT_WRONG.includes(run.status) ? "" : plain(run.error || "");
  health.render(run, { stepTimeS: headlineOf(analysis).step_time_s });
  $("#run-sweep").hidden = !run.sweep_id;
  if (run.sweep_id) {
    $("#run-sweep-link").textContent = run.sweep_id;
    $("#run-sweep-link").href = `/sweeps/${encodeURIComponent(run.sweep_id)}`;
  }
  $("#clone-link").href = `/new?clone=${encodeURIComponent(run.id)}`;
  const cancel = $("#cancel-btn");
  cancel.hidden = FINISHED.includes(run.status) || run.can_modify === false;
  renderCards();
  mountHosts(run, analysis, $("#hosts-section"), $("#hosts"));
  mountDiagnosis(run, $("#diagnosis"));
  if (FINISHED.includes(run.status)) mountResume(run, $("#resume"));
}

// One card per headline figure of the analysis; `data-value` carries the raw number (what the
// export's headline table holds), the title the rule the figure follows.
function card(key, label, value, text, sub, ruleText) {
  return el("div", { class: "card", title: ruleText || null,
    dataset: { card: label, key, value: value === null || value === undefined ? "" : String(value) } },
  el("div", { class: "label", text: label }), el("div", { class: "value", text }),
  sub ? el("div", { class: "sub", text: sub }) : null);
}

// How the layers were cut into stages (summary.pipeline.partition), e.g. " · layers 2/3 (measured)"
function partitionNote() {
  const part = run.summary?.pipeline?.partition;
  if (!part || !Array.isArray(part.layers_per_stage)) return "";
  return ` · layers ${part.layers_per_stage.map(Number).join("/")} (${String(part.mode)})`;
}

// Which steps have detailed records (bounded tracing, spec `trace`): the analysis' run.trace;
// every step has its loss and step time whatever the schedule.
function renderTraceCoverage() {
  const box = $("#trace-coverage");
  const t = analysis?.run?.trace;
  box.hidden = !t || !t.steps;
  if (box.hidden) return;
  const all = t.traced_step_count === t.steps;
  box.dataset.tracedSteps = t.traced_steps || "";
  box.textContent = (all ? `Traced steps: all ${t.steps}` : `Traced steps: ` +
    `${t.traced_steps || "none"} (${t.traced_step_count} of ${t.steps}; the others have loss ` +
    "and step time only)") + (t.capped_ranks?.length
      ? ` · record cap reached on rank${t.capped_ranks.length > 1 ? "s" : ""} ` +
        t.capped_ranks.join(", ") : "") + (t.schedule ? ` · schedule: ${t.schedule}` : "");
}

// A run analysed by the columnar scale path keeps its large tables whole in Parquet
// (analysis.table_files); the charts draw analysis.json's even sample of them, the CSV
// downloads and the API's ?table= pages read every row.
function renderTableSampling() {
  const box = $("#table-sampling");
  const files = analysis?.table_files || {};
  const names = Object.keys(files);
  box.hidden = !names.length;
  if (box.hidden) return;
  box.textContent = "Large tables (columnar engine): " + names.map((n) =>
    `${n} ${Number(files[n].rows).toLocaleString("en-US")} rows, charts draw every ` +
    `${Number(files[n].stride)}th`).join(" · ") + "; the CSV downloads hold every row.";
}

// A benchmark run (kind collective_bench / compute_bench) has no training figures: its cards
// say what it measured, from its summary, instead of seven empty training cards.
function benchCards() {
  const s = run.summary || {};
  const sizes = Array.isArray(s.sizes) ? s.sizes : [];
  const ops = Array.isArray(s.ops) ? s.ops : run.spec?.collective?.ops || [];
  const cards = run.kind === "collective_bench" ? [
    card("ops", "collectives", ops.join(", "), ops.join(", ") || "–",
      (s.algorithms || run.spec?.collective?.algorithms || []).join(", ")),
    card("sizes", "sizes", sizes.length, sizes.length ? `${sizes.length} sizes` : "–",
      sizes.length ? `${fmtBytes(Math.min(...sizes))} – ${fmtBytes(Math.max(...sizes))}` : ""),
    card("all_correct", "results checked", s.all_correct ?? "", s.all_correct === undefined
      ? "–" : s.all_correct ? "all correct" : "wrong results", s.check === false ? "not checked"
      : "each result compared with the expected sum"),
  ] : [];
  cards.push(card("wall_s", "wall time", s.wall_s ?? "", fmtSeconds(s.wall_s), run.kind));
  $("#cards").replaceChildren(...cards);
  $("#cards").dataset.kind = run.kind;
}

function renderCards() {
  renderTraceCoverage();
  renderTableSampling();
  if (run.kind === "import") { $("#cards").replaceChildren(...importCards(run)); return; }
  if (run.kind !== "train") { benchCards(); return; }
  const a = analysis;
  const h = headlineOf(a);
  if (gantt) gantt.setHeadline(h); // the timeline header's bubble is this card's figure
  const steps = a ? stepsLabel(h) : "no trace yet";
  const tok = h.tokens_per_s;
  const strag = h.straggler_rank;
  const bubbleSub = run.pp > 1 ? `measured; simulated ${fmtPct(h.bubble_simulated_fraction, true)}` +
    ` · predicted ${fmtPct(h.predicted_bubble_fraction, true)} · ${steps}${partitionNote()}`
    : "no pipeline";
  $("#cards").replaceChildren(
    card("step_time_s", "step time", h.step_time_s, fmtSeconds(h.step_time_s),
      `median of ${steps}`, rule(a, "step_time")),
    card("tokens_per_s", "throughput", tok, fmtThroughput(tok, h),
      steps),
    card("peak_memory_bytes", "peak memory", h.peak_memory_bytes, fmtBytes(h.peak_memory_bytes),
      "busiest rank, every component incl. buffers"),
    card("bubble_fraction", "bubble", h.bubble_fraction, fmtPct(h.bubble_fraction, true),
      bubbleSub, rule(a, "bubble")),
    card("overlap_pct", "overlap", h.overlap_pct, fmtPct(h.overlap_pct),
      `comm hidden under compute, ${steps}`, rule(a, "overlap")),
    card("exposed_comm_s", "exposed comm", h.exposed_comm_s, fmtSeconds(h.exposed_comm_s),
      `mean per step and rank, ${steps}`, rule(a, "exposed_comm")),
    card("straggler_rank", "straggler", strag, strag === null || strag === undefined ? "none"
      : `rank ${strag}`, strag === null || strag === undefined ? "no rank kept the others waiting"
      : `last to arrive in ${h.straggler_flagged_steps} steps, median wait ` +
        `${fmtSeconds(h.straggler_wait_s)}` + (h.straggler_cost_s === null ||
        h.straggler_cost_s === undefined ? "" : `; costs ${fmtSeconds(h.straggler_cost_s)} ` +
        "of step time in its late steps"), rule(a, "straggler")));
  $("#cards").title = a ? rule(a, "steady_steps") : "";
}

// One download menu: the analysis (Perfetto trace, analysis JSON, each table as CSV, all from
// GET /export) first, then the run's own files that are not those same documents again.
async function renderDownloads() {
  const box = $("#downloads");
  const names = Object.keys(analysis?.tables || {});
  const derived = [
    ["Perfetto trace (open in ui.perfetto.dev)", api.exportUrl(run.id, "perfetto")],
    ["Kineto (HTA / TensorBoard)", api.exportUrl(run.id, "kineto"),
      "zip of rank{R}.pt.trace.json"],
    ["analysis JSON (every table)", api.exportUrl(run.id, "json")],
    ...names.map((t) => [`${t}.csv`, api.exportUrl(run.id, "csv", t),
      analysis?.table_files?.[t] ? `${Number(analysis.table_files[t].rows)} rows` : ""]),
  ];
  const OFFERED = new Set(["analysis.json", "trace.perfetto.json"]); // offered above
  let files = [];
  try { files = (await api.files(run.id)).filter((f) => !OFFERED.has(f.path)); } catch { files = []; }
  // what torch's own tools read, when the run has it (docs/faults.md, docs/checkpoints.md)
  if (files.some((f) => /^flight\/flight_rank_\d+$/.test(f.path))) {
    derived.push(["Flight records (torch's fr_trace)", api.exportUrl(run.id, "flight"),
      "zip of flight/flight_rank_{R}"]);
  }
  if (files.some((f) => /^checkpoints\/step-\d+\/COMMITTED$/.test(f.path))) {
    derived.push(["Checkpoint (torch.distributed.checkpoint)", api.exportUrl(run.id,
      "checkpoint"), "the latest complete one, a zip"]);
  }
  const group = (title, links) => el("div", { class: "dl-group" }, el("h3", { text: title }),
    el("ul", {}, ...links.map(([t, href, sub]) => el("li", {}, el("a", { href, text: t,
      download: "" }), sub ? el("span", { class: "muted", text: ` ${sub}` }) : null))));
  box.replaceChildren(el("details", { class: "menu" },
    el("summary", { text: `Downloads (${derived.length + files.length})` }),
    group("Analysis", derived),
    files.length ? group("Run files", files.map((f) => [f.path, api.fileUrl(run.id, f.path),
      fmtBytes(f.size)])) : null));
}

function appendLog(line) {
  logLines.push(plain(line)); // (emoji draw as boxes; the log download keeps them)
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
    if (ev.data !== run.status) {
      run = await api.run(run.id);
      renderHead();
      if (!FINISHED.includes(run.status) && !analysis) showPlaceholders();
    }
  });
  stream.addEventListener("end", async () => {
    stream.close();
    $("#log-info").textContent = "run finished";
    // a run that had already ended when the page opened is drawn again only if something the
    // head shows changed: redrawing it would close a traceback the reader had just opened
    const fresh = await api.run(run.id);
    const changed = fresh.status !== run.status || !fresh.summary !== !run.summary;
    run = fresh;
    if (changed) renderHead();
    document.body.dataset.logEnd = changed ? "redrawn" : "kept";
    loadCharts();
  });
}

async function loadCharts() {
  if (chartsLoaded) return;
  chartsLoaded = true;
  if (live) { live.close(); live = null; }
  try { analysis = await api.metrics(run.id, { fresh: true }); } catch (e) {
    $("#run-error").textContent = e.message;
  }
  renderCards();
  mountHosts(run, analysis, $("#hosts-section"), $("#hosts"));
  renderDownloads();
  if (run.kind === "import") await mountImported(run, analysis, $("#imported-section"));
  if (run.kind === "collective_bench") {
    $("#memory-section").hidden = true;
    $("#curves-section").hidden = true;
    await mountSweepChart($("#comm-busbw"), [run.id]);
  }
  if (gantt) await gantt.load();
  else gantt = await mountGantt(run.id, run.pp > 1, headlineOf(analysis));
  // an import's analysis comes from the same engine: its memory, communication and curves
  // draw as a run's (the sections with no data for it were hidden by mountImported)
  if ((run.kind === "train" || run.kind === "import") && analysis) {
    await Promise.allSettled([
      mountMemory(analysis, $("#memory-chart"), $("#memory-table")),
      mountComm(analysis, analysis.bandwidth_vs_sweep ? await sweepOf(analysis) : null),
      mountMoe(analysis, $("#moe-section")),
      mountCurves(analysis, $("#loss-chart"), $("#throughput-chart"), await parentCurve())]);
  }
  settlePlaceholders();
  // which analysis the page drew: "final" (stored when the run ended) or "partial" (the
  // traces so far); a stopped run is drawn again once its final analysis is in
  document.body.dataset.analysis = analysis ? (analysis.partial ? "partial" : "final") : "none";
  document.body.dataset.chartsReady = "1";
  if (run.kind === "train" && !reportAwaited && (!run.summary || analysis?.partial)) awaitReport();
}

// A stopped run reports its outcome at once, then analyses and uploads what it has: once that
// report is in (the summary), draw the page again from the stored analysis and files.
async function awaitReport(tries = 45) {
  reportAwaited = true; // once: a run whose worker never analysed stays on its partial figures
  for (let i = 0; i < tries; i++) {
    await new Promise((r) => setTimeout(r, 2000));
    try { run = await api.run(run.id); } catch { continue; }
    if (run.summary) {
      // the summary is reported with the stored analysis: draw the page from it
      chartsLoaded = false;
      renderHead();
      await loadCharts();
      return;
    }
  }
}

// While the run goes: every "traces" event of GET /live (the worker shipped more trace lines)
// refetches the analysis of the partial traces and redraws the cards, the curves, the memory
// chart and the timeline on the latest traced step. One refresh at a time, at most one a second.
function goLive() {
  if (run.kind !== "train") return;
  live = api.liveStream(run.id);
  live.addEventListener("traces", () => refreshLive());
  live.addEventListener("end", () => { live.close(); live = null; });
}

async function refreshLive() {
  if (liveBusy) { liveAgain = true; return; }
  liveBusy = true;
  try {
    const a = await api.metrics(run.id, { fresh: true });
    if (chartsLoaded || !a) return;
    analysis = a;
    renderCards();
    await Promise.allSettled([mountCurves(a, $("#loss-chart"), $("#throughput-chart"),
      await parentCurve()),
      mountMemory(a, $("#memory-chart"), $("#memory-table")), mountComm(a, null),
      mountMoe(a, $("#moe-section"))]);
    const steps = (await api.ganttSteps(run.id)).steps.map((x) => x.step);
    if (!chartsLoaded && steps.length) {
      if (!gantt) gantt = await mountGantt(run.id, true, headlineOf(a));
      else if (!gantt.zoomed) {
        // the newest step the ranks have all finished (the last one may be mid-way)
        gantt.step = steps[Math.max(0, steps.length - 2)];
        $("#gantt-step").replaceChildren(...steps.map((x) => el("option", { value: String(x),
          text: `step ${x}` })));
        $("#gantt-step").value = String(gantt.step);
        await gantt.load();
      }
    }
    settlePlaceholders();
    liveUpdates += 1;
    document.body.dataset.liveUpdates = String(liveUpdates);
  } catch (e) {
    // a refresh that fails (the trace is mid-write) is retried by the next event
  } finally {
    setTimeout(() => {
      liveBusy = false;
      if (liveAgain) { liveAgain = false; refreshLive(); }
    }, LIVE_MIN_GAP_MS);
  }
}

// Until its first figures arrive, each chart of a queued or running run says what it waits for
// (the page opened with empty boxes for the seconds before the first step's traces)
function showPlaceholders() {
  placeholder = run.status === "queued" ? "waiting for the run to start…"
    : "waiting for the first step…";
  for (const sel of CHART_BOXES) {
    const div = $(sel);
    if (div && !div.dataset.ready) emptyChart(div, placeholder);
  }
  if (!$("#gantt-info").textContent) $("#gantt-info").textContent = placeholder;
}

// once figures were drawn, a box its chart did not use no longer waits: say so; and a box
// nothing was drawn in (a run that left no trace) says so in a short box, not 360 px of blank
function settlePlaceholders() {
  const none = FINISHED.includes(run.status) ? "nothing recorded for this chart"
    : "nothing for this chart yet";
  for (const sel of CHART_BOXES) {
    const div = $(sel);
    if (!div || div.dataset.ready) continue;
    const waiting = placeholder && div.classList.contains("empty") && div.textContent === placeholder;
    const blank = !div.classList.contains("empty") && !div.childElementCount && !div.textContent;
    if (waiting || blank) emptyChart(div, analysis || !FINISHED.includes(run.status) ? none
      : "no trace for this run");
  }
}

// A queued or running run's first screen is refetched: the reason it waits, or the age of
// its last progress (health.js counts the seconds in between)
function pollHealth() {
  setTimeout(async () => {
    if (FINISHED.includes(run.status)) return;
    try {
      const fresh = await api.run(run.id);
      if (fresh.status !== run.status) {
        run = fresh;
        renderHead();
        if (!FINISHED.includes(run.status) && !analysis) showPlaceholders();
      } else {
        run = fresh;
        health.render(run, { stepTimeS: headlineOf(analysis).step_time_s });
      }
    } catch { /* the next poll tries again */ }
    pollHealth();
  }, document.hidden ? POLL_MS * 3 : POLL_MS);
}

// A resumed run's parent: its name and per-step losses, drawn dashed under this run's loss
// (fetched once; null when the run has no parent or the parent has no analysis)
let parentOnce = null;
function parentCurve() {
  if (!run.parent_id) return Promise.resolve(null);
  if (!parentOnce) {
    parentOnce = Promise.all([api.run(run.parent_id), api.metrics(run.parent_id)])
      .then(([p, a]) => (a ? { name: p.name, id: p.id, analysis: a } : null))
      .catch(() => null);
  }
  return parentOnce;
}

async function sweepOf(a) {
  try { return (await api.collectiveSweeps([a.bandwidth_vs_sweep.sweep_run_id]))[0] || null; } catch {
    return null;
  }
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
    if (!window.confirm(`Cancel run ${run.name}? It stops now; the steps it completed stay.`)) return;
    $("#cancel-btn").disabled = true;
    try { run = await api.cancel(run.id); renderHead(); } catch (e) { $("#run-error").textContent = e.message; }
  });
  connect();
  if (FINISHED.includes(run.status)) loadCharts();
  else { showPlaceholders(); goLive(); pollHealth(); }
}

init();
