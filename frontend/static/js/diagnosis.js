// A run that went wrong: the one-sentence diagnosis first (summary.diagnosis, written by the
// worker from the ranks' flight files and stacks: jobs/analysis/diagnose.py), then each rank's
// state, the first place the ranks' collective sequences disagree, and every rank's stack
// (diagnosis.json). Also what the run was given on purpose (spec.faults), its restart attempts,
// the run it resumed from, and its complete checkpoints with a Resume button.
import { api } from "./api.js";
import { el, fmtBytes } from "./dom.js";
import { diagnosisFile, plain, WENT_WRONG } from "./health.js";

// "all_reduce #57 (4.0 KB float32)" from a collective record of the flight file
export function collText(c) {
  if (!c || typeof c !== "object") return c === null || c === undefined ? "–" : String(c);
  const size = c.payload_bytes !== undefined ? fmtBytes(c.payload_bytes) : null;
  const extra = [size, c.dtype].filter(Boolean).join(" ");
  return `${c.op ?? "?"} #${c.seq ?? "?"}${extra ? ` (${extra})` : ""}` +
    (c.step !== undefined && c.step !== null ? ` step ${c.step}` : "");
}

// what the ranks must agree on at one position: "all_reduce 4.0 KB float32"
const sigText = (e) => [e.op ?? "?", e.payload_bytes !== undefined && e.payload_bytes !== null
  ? fmtBytes(e.payload_bytes) : null, e.dtype].filter(Boolean).join(" ");

function groupCells(g) {
  if (!g || typeof g !== "object") return "–";
  return Object.entries(g).map(([key, v]) =>
    `${key}: in ${collText(v?.in_flight ?? v?.entered)} · done ${collText(v?.last_completed)}`)
    .join("\n");
}

function rankTable(rows) {
  const head = el("tr", {}, ...["rank", "state", "step", "collectives (entered · completed)",
    "where"].map((t) => el("th", { text: t })));
  return el("table", { class: "data compact", id: "diagnosis-ranks" }, el("thead", {}, head),
    el("tbody", {}, ...rows.map((r) => el("tr", { dataset: { rank: String(r.rank) } },
      el("td", { text: String(r.rank) }), el("td", { text: plain(r.state ?? "–") }),
      el("td", { text: r.step === undefined || r.step === null ? "–" : String(r.step) }),
      el("td", { class: "pre", text: groupCells(r.groups) }),
      el("td", { class: "pre", text: String(r.stack ?? "–") })))));
}

function mismatchList(groups) {
  const items = (groups || []).filter((g) => g.first_mismatch).map((g) => {
    const m = g.first_mismatch;
    const per = Object.entries(m.per_rank || {}).map(([r, v]) =>
      `rank ${r}: ${v && typeof v === "object" ? sigText(v) : v}`).join("; ");
    return el("li", { text: `group ${g.key}${g.ranks ? ` [${g.ranks.join(",")}]` : ""}, ` +
      `position #${m.seq}: ${per}` });
  });
  return items.length ? el("div", {}, el("h3", { text: "First disagreement" }),
    el("ul", { id: "diagnosis-mismatch" }, ...items)) : null;
}

// The ranks' tracebacks in the diagnosis' order (the rank that failed first, then the ranks
// that only lost their peer), then every rank's stack
async function stacks(run) {
  const full = await diagnosisFile(run);
  const texts = { ...(full?.errors || {}), ...(full?.stacks || {}) };
  const keys = Object.keys(full?.stacks || {});
  const order = (run.summary?.diagnosis?.left || []).map((x) => String(x.rank));
  const rankOf = (r) => (order.includes(r) ? order.indexOf(r) : order.length + Number(r));
  const errs = Object.keys(full?.errors || {}).sort((a, b) => rankOf(a) - rankOf(b));
  if (!keys.length && !errs.length) return null;
  const block = (title, text) => el("details", {}, el("summary", { text: title }),
    el("pre", { class: "log", text: plain(text) }));
  return el("div", { id: "diagnosis-stacks" }, el("h3", { text: "Stacks and tracebacks" }),
    ...errs.map((r) => block(`rank ${r}: traceback`, full.errors[r])),
    ...keys.map((r) => block(`rank ${r}: stack when stopped`, texts[r])));
}

export async function mountDiagnosis(run, box) {
  const d = run.summary?.diagnosis;
  const faults = run.faults || [];
  const attempts = run.summary?.attempts || [];
  const parts = [];
  if (d?.sentence) {
    parts.push(el("p", { id: "diagnosis-sentence", class: "diagnosis",
      text: plain(d.sentence) }));
    if (Array.isArray(d.ranks) && d.ranks.length) parts.push(rankTable(d.ranks));
    const mm = mismatchList(d.groups);
    if (mm) parts.push(mm);
  }
  if (faults.length) {
    parts.push(el("p", { id: "run-faults", class: "muted",
      text: `Injected faults: ${faults.join("; ")}` }));
  }
  if (attempts.length > 1) {
    parts.push(el("div", { id: "attempts" }, el("h3", { text: "Attempts" }),
      el("ol", {}, ...attempts.map((a) => el("li", { text: `attempt ${a.attempt}: ` +
        `${a.cause || "completed"}${a.first_step !== undefined ? ` (steps ${a.first_step}-` +
        `${a.last_step ?? "?"})` : ""}` })))));
  }
  if (run.parent_id) {
    const step = run.spec?.resume?.step;
    parts.push(el("p", { id: "parent-link" }, "Resumed from ",
      el("a", { href: `/runs/${encodeURIComponent(run.parent_id)}`, text: run.parent_id }),
      ` at step ${step}`));
  }
  if (d?.sentence) {
    const s = await stacks(run);
    if (s) parts.push(s);
  }
  box.replaceChildren(...parts);
  const section = box.closest("section");
  section.hidden = parts.length === 0;
  // a run that did not go wrong (a resumed or restarted run that succeeded, a run with a
  // fault that did no harm) shows its lineage, attempts and faults, not "What went wrong"
  const title = section.querySelector("#diagnosis-title");
  if (title) title.textContent = WENT_WRONG.includes(run.status) ? "What went wrong"
    : "Lineage, attempts and faults";
}

// Complete checkpoints (every rank's shard and the commit marker) and the Resume button: it
// submits POST /api/runs/{id}/resume and opens the new, linked run.
export async function mountResume(run, box) {
  if (run.kind !== "train") return;
  let cps = [];
  try { cps = await api.checkpoints(run.id); } catch { cps = []; }
  const section = box.closest("section");
  section.hidden = !cps.length;
  if (!cps.length) return;
  const sel = el("select", { id: "resume-step" }, ...cps.map((c) => el("option",
    { value: String(c.step), text: `step ${c.step} · ${c.strategy ?? ""} · ${c.world_size ?? "?"} ranks` })));
  sel.value = String(cps[cps.length - 1].step);
  const msg = el("p", { class: "error", role: "alert", id: "resume-error" });
  const btn = el("button", { type: "button", id: "resume-btn", text: "Resume from checkpoint",
    disabled: run.can_modify === false ? true : null });
  btn.addEventListener("click", async () => {
    btn.disabled = true;
    msg.textContent = "";
    try {
      const child = await api.resume(run.id, { step: Number(sel.value) });
      location.href = `/runs/${encodeURIComponent(child.id)}`;
    } catch (e) {
      msg.textContent = e.message;
      btn.disabled = false;
    }
  });
  box.replaceChildren(el("div", { class: "toolbar" }, el("label", {}, "Checkpoint ", sel), btn),
    msg);
}
