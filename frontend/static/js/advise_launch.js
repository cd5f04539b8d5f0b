// The advisor's hardware truth and its "launch top k as a sweep" (/advise). A ranking at
// figures typed into the form (the defaults are a GPU cluster's: 300 TFLOP/s, 300 GB/s) is
// a ranking against ASSUMED hardware: the page says so and names the figures, offers the
// queue's measured ones where it has them, and a sweep launched at assumed figures is
// launched only after a warning, since its calibration would then score the assumption (on a
// CPU host: about −100 % on every term), not the theory (issue 37).
import { $, el } from "./dom.js";
import { fmt } from "./units.js";

// Spearman's rank correlation needs 3 ranked members (jobs/theory/calibration.py)
export const SPEARMAN_MIN = 3;

// The figures the ranking used that nobody measured: [{key, text}]. `bandwidth_source` names
// the fields the queue's sweep filled, e.g. "... on queue 'q' (intra_GBps, inter_GBps)".
export function assumedFigures(res) {
  const c = res.cluster || {};
  const out = [];
  if (res.model?.arch !== "timed" && c.flops !== undefined && !c.flops_source) {
    out.push({ key: "flops", text: `${fmt(c.flops, "FLOP/s")} per device` });
  }
  const filled = c.bandwidth_source || "";
  if (!filled.includes("intra_GBps")) {
    out.push({ key: "intra", text: `${fmt(c.intra_GBps * 1e9, "B/s")} intra-host` });
  }
  if (!filled.includes("inter_GBps")) {
    out.push({ key: "inter", text: `${fmt(c.inter_GBps * 1e9, "B/s")} inter-host` });
  }
  return out;
}

// What the named queue measured that this ranking did not use: the fields to empty so the
// server fills them from the queue ({ids: [...], text}), or null.
function unusedMeasured(res, assumed) {
  const q = res.queue_measured;
  if (!q) return null;
  const keys = new Set(assumed.map((a) => a.key));
  const ids = [];
  const said = [];
  if (q.bandwidth_GBps && (keys.has("intra") || keys.has("inter"))) {
    ids.push("intra", "inter");
    said.push(`${fmt(q.bandwidth_GBps * 1e9, "B/s")} (${q.bandwidth_source})`);
  }
  if (q.flops && keys.has("flops")) {
    ids.push("tflops");
    said.push(`${fmt(q.flops, "FLOP/s")} per device (${q.flops_source})`);
  }
  return ids.length ? { ids, text: said.join("; ") } : null;
}

// The banner under the form. `rerun(ids)`: empty those fields and ask again.
export function renderAssumed(res, rerun) {
  const box = $("#advise-assumed");
  const assumed = assumedFigures(res);
  box.hidden = assumed.length === 0;
  box.dataset.assumed = assumed.map((a) => a.key).join(" ");
  if (!assumed.length) {
    box.replaceChildren();
    return;
  }
  const parts = [el("strong", { text: "Ranked against ASSUMED hardware: " }),
    `${assumed.map((a) => a.text).join(", ")} — figures typed in the form (the defaults are ` +
    "a GPU cluster's), not measured on any host. "];
  const q = res.queue_measured;
  const use = unusedMeasured(res, assumed);
  if (use) {
    parts.push(`Queue “${q.queue}” has measured ${use.text}. `, el("button", {
      type: "button", id: "advise-use-measured", class: "small",
      text: `Rank with queue “${q.queue}”'s measured figures`, onclick: () => rerun(use.ids) }));
  } else if (q) {
    parts.push(`Queue “${q.queue}” has no measured figures for these: run the ` +
      "collective-sweep and compute-calibration presets on it (New run), then empty these " +
      "fields to rank against what its hosts measured.");
  } else {
    parts.push("To rank against real hardware, name a queue whose hosts ran a collective " +
      "sweep and a compute calibration, and empty these fields.");
  }
  box.replaceChildren(...parts);
}

// What `spec` changes in `base`, as a sweep member's overrides (deep-merged back by the
// service, docs/sweeps.md): the sweep table then shows what differs, not whole specs.
function overrides(base, spec) {
  const out = {};
  for (const [k, v] of Object.entries(spec)) {
    const b = base?.[k];
    if (v && typeof v === "object" && !Array.isArray(v) && b && typeof b === "object") {
      const sub = overrides(b, v);
      if (Object.keys(sub).length) out[k] = sub;
    } else if (JSON.stringify(v) !== JSON.stringify(b)) out[k] = v;
  }
  return out;
}

// The sweep body: candidate 1's spec as the base, each of the top k as a member's overrides.
// `cluster`: the bandwidths and rate the ranking used, so every member stores the advisor's
// breakdown and the sweep page can re-state the ranking as measured (docs/sweeps.md);
// `queue`: the queue the advisor was asked about, so the runs measure the hosts whose
// figures ranked them.
export function sweepBody(cands, k, name, cluster, queue) {
  const top = cands.slice(0, k);
  const body = { name, base: top[0].spec, members: top.map((c) => overrides(top[0].spec,
    c.spec)) };
  if (cluster) {
    body.cluster = { intra_GBps: cluster.intra_GBps, inter_GBps: cluster.inter_GBps };
    if (cluster.flops) body.cluster.flops = cluster.flops;
  }
  if (queue) body.queue = queue;
  return body;
}

// The k the launch uses, within [1, candidates]
export function launchK(res) {
  return Math.max(1, Math.min(Number($("#launch-k").value) || 1, res?.candidates.length || 1));
}

// Said before the launch, as k changes: a sweep of fewer than 3 members gets no rank
// correlation (its page says so too), only the per-term errors.
export function renderKNote(res) {
  const note = $("#launch-note");
  const k = launchK(res);
  note.hidden = !res?.candidates.length || k >= SPEARMAN_MIN;
  note.textContent = note.hidden ? "" : `Spearman's rank correlation (does the measured ` +
    `order match the predicted one?) needs ≥ ${SPEARMAN_MIN} members; a sweep of ${k} is ` +
    "compared term by term only.";
}

// The warning a launch at assumed figures shows first; true when it was shown now (the
// launch waits for a second click on "Launch anyway").
export function warnFirst(res, state) {
  const assumed = assumedFigures(res);
  const warn = $("#launch-warning");
  if (!assumed.length || state.confirmed) return false;
  state.confirmed = true;
  warn.hidden = false;
  warn.textContent = `Warning: this sweep's calibration will compare each run with the ` +
    `predictions at ASSUMED ${assumed.map((a) => a.text).join(", ")}. On hosts that differ ` +
    "(a CPU host is orders of magnitude below a GPU's figures) every term's error then " +
    "measures the assumption, not the theory. Launch anyway, or rank with measured figures " +
    "first (above).";
  $("#launch-go").textContent = "Launch anyway";
  return true;
}

export function resetLaunch(state) {
  state.confirmed = false;
  $("#launch-warning").hidden = true;
  $("#launch-warning").textContent = "";
  $("#launch-go").textContent = "Launch top k as a sweep";
}
