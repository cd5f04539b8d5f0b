// The advisor's answer on the page (/advise): the model it is for, the counts, where the
// cluster figures came from, the ranked table and its breakdown bars. Every figure goes
// through units.js (a 4-layer model's step is microseconds: "0.0000 s" said nothing), every
// string from the user or the server through textContent (dom.js el) or esc() in Plotly text.
import { PALETTE, layout, plot } from "./charts.js";
import { $, el, esc } from "./dom.js";
import { axisUnit, fmt, fmtBytes, fmtTime } from "./units.js";

// The model the ranking is for, as the server resolved it (a preset and the form's fields):
// the page shows it so the answer can be checked against the fields above it.
export function modelLine(res) {
  const m = res.model || {};
  const parts = [m.arch, `${m.layers} layers`, `hidden ${m.hidden}`];
  if (m.arch === "gpt") parts.push(`${m.heads} heads`, `seq_len ${m.seq_len}`, `vocab ${m.vocab}`);
  if (m.arch === "timed") {
    parts.push(`${fmtTime(m.t_forward)} / ${fmtTime(m.t_backward_input)} / ` +
      `${fmtTime(m.t_backward_weight)} per layer (forward / backward input / weight)`);
  }
  if (m.experts > 0) parts.push(`${m.experts} experts, top-${m.top_k}`);
  const c = res.cluster || {};
  return `Ranked for: ${parts.join(", ")} · global batch ${res.global_batch} · ` +
    `${c.hosts} host${c.hosts > 1 ? "s" : ""} × ${c.devices_per_host} devices of ` +
    `${fmtBytes(c.device_memory_bytes)}`;
}

export function counts(c) {
  const invalid = Object.values(c.invalid).reduce((a, b) => a + b, 0);
  const pruned = Object.values(c.pruned).reduce((a, b) => a + b, 0);
  const reasons = Object.entries({ ...c.pruned, ...c.invalid })
    .sort((a, b) => b[1] - a[1]).slice(0, 4).map(([r, n]) => `${n} × ${r}`).join("; ");
  return `${c.considered} layouts considered: ${c.fitting} fit, ${c.not_fitting} do not fit ` +
    `in memory, ${invalid} refused by the spec validator, ${pruned} pruned by divisibility` +
    (reasons ? ` (${reasons})` : "");
}

// Where the cluster figures came from: given, or measured on the queue (the latest collective
// sweep's bandwidth, the latest compute calibration's FLOP/s), as the server names them.
export function sources(c) {
  const rows = [];
  if (c.flops !== undefined) {
    rows.push(["flops", `compute rate ${fmt(c.flops, "FLOP/s", { sig: 4 })} per device: ` +
      `${c.flops_source ?? "given"}`]);
  }
  rows.push(["bandwidth", `bandwidth intra ${fmt(c.intra_GBps * 1e9, "B/s")}, inter ` +
    `${fmt(c.inter_GBps * 1e9, "B/s")}: ${c.bandwidth_source ?? "given"}`]);
  return rows.map(([k, t]) => el("div", { dataset: { source: k }, text: t }));
}

export async function bars(cands) {
  const labels = cands.map((c) => `#${c.rank} ${c.label}`);
  const axes = [...new Set(cands.flatMap((c) => Object.keys(c.predicted.comm_s)))];
  // one unit for the whole chart (µs for a small model, s for a large one), from the longest bar
  const u = axisUnit(cands.map((c) => c.predicted.step_s), "s");
  const trace = (name, ys, color) => ({ type: "bar", orientation: "h", name, y: labels,
    x: ys.map((v) => v / u.div), marker: { color },
    text: ys.map((v) => `${esc(name)}: ${fmtTime(v)}`), textposition: "none",
    hovertemplate: "%{text}<br>%{y}<extra></extra>" });
  const data = [
    trace("compute", cands.map((c) => c.predicted.compute_s), PALETTE[0]),
    trace("bubble", cands.map((c) => c.predicted.bubble_s), PALETTE[1]),
    ...axes.map((a, i) => trace(`comm ${a}`, cands.map((c) => c.predicted.comm_s[a] || 0),
      PALETTE[2 + (i % 7)])),
  ];
  // the legend goes a fixed distance under the axis title (a fraction of a short chart's
  // height would put it on the title)
  const height = 170 + 28 * cands.length;
  const lay = layout("Predicted step time, by term", u.title("step time"), "",
    { barmode: "stack", yaxis: { autorange: "reversed" }, height,
      margin: { l: 70, r: 20, t: 45, b: 110 }, legend: { y: -60 / (height - 155) } });
  lay.yaxis.title = { text: "" };
  await plot($("#advise-bars"), data, lay);
}

function ruleCell(rules) {
  return el("td", { class: "rules" }, rules.filter((r) => r.status !== "n/a").map((r) =>
    el("div", { class: `rule rule-${r.status}`, dataset: { rule: r.rule, status: r.status },
      title: r.why, text: `${r.status === "follows" ? "✓" : "✗"} ${r.rule}: ${r.why}` })));
}

// a time cell: the scaled text, and the value in seconds for whoever reads the table back
const timeCell = (s) => el("td", { class: "num", dataset: { s: String(s) }, text: fmtTime(s) });

export function table(cands) {
  const head = el("tr", {}, ["#", "layout", "step", "compute", "bubble", "comm", "memory/rank",
    "rules of thumb", "why", "neighbours ruled out"].map((h) => el("th", { text: h })));
  const rows = cands.map((c) => {
    const p = c.predicted;
    const comm = Object.values(p.comm_s).reduce((a, b) => a + b, 0);
    const nb = c.neighbours.filter((n) => n.status !== "slower").slice(0, 4);
    return el("tr", { dataset: { rank: c.rank, label: c.label } },
      el("td", { text: String(c.rank) }), el("td", { class: "mono", text: c.label }),
      timeCell(p.step_s), timeCell(p.compute_s), timeCell(p.bubble_s), timeCell(comm),
      el("td", { class: "num", dataset: { bytes: String(p.memory_bytes) },
        text: fmtBytes(p.memory_bytes) }), ruleCell(c.rules),
      el("td", { class: "why" }, c.why.map((w) => el("div", { text: w }))),
      el("td", { class: "why" }, nb.map((n) => el("div", { text: `${n.change}: ${n.reason}` }))));
  });
  $("#advise-table").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
}
