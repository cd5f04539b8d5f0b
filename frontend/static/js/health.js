// The run page's first screen answers "is it healthy?" (issue 37): one block under the title
// that says, by status, why a queued run waits (the cluster page's reason), whether a running
// run still makes progress (the age of its last step line, and the countdown to
// runtime.hang_timeout_s), and for a run that went wrong the rank that failed first and its
// cause, then its traceback, then the ranks that only lost their peer, grouped.
// Every text reaches the page through el() (textContent): run names, errors and tracebacks
// are data, never markup.
import { api } from "./api.js";
import { el, fmtSeconds } from "./dom.js";

export const WENT_WRONG = ["failed", "hung", "timed_out"];
// a running run is called stalled once its last progress is this old and 10 step times old
const STALL_MIN_S = 10;

// Emoji (gloo's "GLHF! 🏖️") draw as a box where the machine has no emoji font: error texts
// are shown without them (the pictograph planes, the emoji presentation selector and the
// joiner; ©, ✓ or ⚠ are in the text fonts and stay), and without the space left at a line's end.
export function plain(text) {
  return String(text ?? "").replace(/[\u{1F000}-\u{1FAFF}\uFE0F\u200D]/gu, "")
    .replace(/[ \t]+$/gm, "");
}

// The same wording as jobs/analysis/diagnose.ranks_text: "rank 3", "ranks 0-2", "ranks 0, 2"
export function ranksText(ranks) {
  const rs = [...new Set(ranks)].sort((a, b) => a - b);
  if (rs.length === 1) return `rank ${rs[0]}`;
  if (rs.length > 2 && rs[rs.length - 1] - rs[0] === rs.length - 1) {
    return `ranks ${rs[0]}-${rs[rs.length - 1]}`;
  }
  return `ranks ${rs.join(", ")}`;
}

// errors that only report a peer's failure: diagnose.py's PEER_ERROR, for diagnoses stored
// before `lost_peer` was recorded
const PEER_ERROR = /closed by peer|reset by peer|remote worker|Broken pipe|NCCL communicator was aborted|Timed out|timeout/i;

// diagnose.py's PEER_ADDRESS
const PEER_ADDRESS = /\[[^\]\s]*\]:\d+|\b\d{1,3}(?:\.\d{1,3}){3}:\d+\b/g;

// diagnosis.json (every rank's traceback and stack), fetched once per run and status
const fullCache = {};
export function diagnosisFile(run) {
  const key = `${run.id}:${run.status}:${run.summary ? 1 : 0}`;
  if (!fullCache[key]) {
    fullCache[key] = fetch(api.fileUrl(run.id, "diagnosis.json"))
      .then((r) => (r.ok ? r.json() : null)).catch(() => null);
  }
  return fullCache[key];
}

// The failed ranks in the order diagnose.py sorted them (the first failure first, the ranks
// that only lost their peer after): [culprit, [{ranks, words, lostPeer}]]
export function culpritAndVictims(d) {
  const left = Array.isArray(d?.left) ? d.left : [];
  if (!left.length) return [null, []];
  const groups = new Map();
  for (const x of left.slice(1)) {
    let words = plain(x.last_words ?? "").trim() || "failed";
    const lostPeer = x.lost_peer ?? PEER_ERROR.test(words);
    // each victim names its own peer's address ("[127.0.0.1]:20714"): one line for them all
    if (lostPeer) words = words.replace(PEER_ADDRESS, "[…]");
    const key = `${lostPeer}|${words}`;
    if (!groups.has(key)) groups.set(key, { ranks: [], words, lostPeer });
    groups.get(key).ranks.push(Number(x.rank));
  }
  // a rank with a cause of its own before the ranks that only lost their peer
  return [left[0], [...groups.values()].sort((a, b) => Number(a.lostPeer) - Number(b.lostPeer))];
}

function tracebackBlock(id, title, text, open) {
  return el("details", { id, class: "traceback", open: open || null },
    el("summary", { text: title }), el("pre", { class: "log", text: plain(text) }));
}

// whole seconds under a minute ("8 s"; a countdown reads better without decimals), then units.js
const secs = (s) => (s < 60 ? `${Math.max(0, Math.round(s))} s` : fmtSeconds(s));

// "last progress 3 s ago (step 7, rank 0)": the server's age when the run was fetched plus
// the time since (so the browser's clock never enters)
function progressText(p, age) {
  const where = p.kind === "step" ? `step ${p.step}, rank ${p.rank}` : `a log line of rank ${p.rank}`;
  return `last progress ${secs(age)} ago (${where})`;
}

export function createHealth(box) {
  let run = null;
  let fetchedAt = 0;
  let stepTime = null;
  let timer = null;

  function age() {
    return (run.progress?.age_s ?? 0) + (performance.now() - fetchedAt) / 1000;
  }

  function hangTimeout() {
    const t = Number(run.spec?.runtime?.hang_timeout_s);
    return Number.isFinite(t) && t > 0 ? t : null;
  }

  // the running run's line, redrawn every second while it runs
  function tick() {
    if (!run || run.status !== "running") return;
    const line = box.querySelector("#health-line");
    if (!line) return;
    const p = run.progress;
    const hang = hangTimeout();
    const parts = [];
    if (!p) {
      parts.push(el("span", { id: "run-progress", dataset: { kind: "none" },
        text: "no step yet: waiting for the first step…" }));
    } else {
      const a = age();
      const stalled = a >= STALL_MIN_S && (!stepTime || a >= 10 * stepTime);
      parts.push(el("span", { id: "run-progress", class: stalled ? "warn" : null,
        dataset: { kind: p.kind, step: String(p.step ?? ""), ageS: a.toFixed(1) },
        text: progressText(p, a) + (stalled ? " — stalled?" : "") }));
      if (hang) {
        const left = Math.max(0, hang - a);
        parts.push(" · ", el("span", { id: "hang-countdown", class: stalled ? "warn" : null,
          dataset: { total: String(hang), left: left.toFixed(0) },
          text: `stopped as hung in ${secs(left)} if nothing moves ` +
            `(runtime.hang_timeout_s = ${secs(hang)} without progress)` }));
      }
    }
    if (!hang) parts.push(" · ", el("span", { class: "muted", text: "no hang timeout set" }));
    line.replaceChildren(el("strong", { text: "running: " }), ...parts);
  }

  async function cause() {
    const d = run.summary?.diagnosis;
    const parts = [];
    if (!d) { // the outcome is reported before the diagnosis: its error's first line for now
      const first = plain(run.error || `${run.status}`).split("\n").find((s) => s.trim()) || "";
      parts.push(el("p", { id: "run-cause", class: "cause", text: `${run.status}: ${first}` }));
      if (WENT_WRONG.includes(run.status)) {
        parts.push(el("p", { class: "muted", text: "the diagnosis follows once the worker has read " +
          "the ranks' files…" }));
      }
      return parts;
    }
    const [culprit, victims] = culpritAndVictims(d);
    parts.push(el("p", { id: "run-cause", class: "cause", dataset: {
      rank: culprit ? String(culprit.rank) : String(d.waited_for ?? "") },
    text: `${run.status}: ${plain(d.sentence || run.error || "")}` }));
    if (run.status === "hung" && run.progress) {
      const p = run.progress;
      parts.push(el("p", { id: "run-last-progress", text: `${progressText(p, p.age_s)
        .replace(" ago", " before it was stopped")}; runtime.hang_timeout_s = ` +
        `${secs(hangTimeout() ?? 0)}` }));
    }
    const full = await diagnosisFile(run);
    const errs = full?.errors || {};
    if (culprit && errs[culprit.rank]) {
      parts.push(tracebackBlock("culprit-traceback", `rank ${culprit.rank}'s traceback ` +
        "(the rank that failed first)", errs[culprit.rank], true));
    }
    if (victims.length) {
      const who = culprit ? `rank ${culprit.rank}` : "the first failure";
      parts.push(el("ul", { id: "run-victims" }, ...victims.map((g) => el("li", {
        dataset: { ranks: g.ranks.join(","), lostPeer: String(g.lostPeer) },
        text: g.lostPeer ? `${ranksText(g.ranks)} lost ${g.ranks.length > 1 ? "their" : "its"} ` +
          `peer (a consequence of ${who}): ${g.words}` : `${ranksText(g.ranks)}: ${g.words}` }))));
    }
    return parts;
  }

  async function render(r, { stepTimeS = null } = {}) {
    run = r;
    fetchedAt = performance.now();
    if (stepTimeS) stepTime = stepTimeS;
    box.dataset.status = run.status;
    let parts;
    if (run.status === "queued") {
      const why = run.wait_reason || run.placement_wait;
      parts = [el("p", { id: "health-line" }, el("strong", { text: "queued: " }),
        el("span", { id: "run-wait", text: why ? `waiting because ${why}`
          : "waiting for a worker to take it" }))];
    } else if (run.status === "running") {
      parts = [el("p", { id: "health-line" })];
    } else if (WENT_WRONG.includes(run.status)) {
      parts = await cause();
      if (run !== r) return; // a newer render started meanwhile
    } else {
      const p = run.progress;
      const imp = run.kind === "import" ? run.summary?.import : null;
      parts = [el("p", { id: "health-line" }, el("strong", { text: imp ? "imported"
        : `${run.status}` }),
        imp ? `: profiler traces of ${(imp.ranks || []).length} of ${imp.world_size} rank(s), ` +
          "made elsewhere" : run.status === "succeeded" ? ": every rank finished" : "",
        p?.kind === "step" ? `; last step ${p.step}` : "",
        run.duration_s ? ` · ${fmtSeconds(run.duration_s)}` : "")];
    }
    box.replaceChildren(...parts);
    box.classList.toggle("wrong", WENT_WRONG.includes(run.status));
    clearInterval(timer);
    timer = null;
    if (run.status === "running") {
      tick();
      timer = setInterval(tick, 1000);
    }
  }

  return { render };
}
