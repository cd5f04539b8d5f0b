// The live prediction panel of the new-run form: memory per rank by component against the
// device memory, communication per step by mesh axis, bubble fraction, and the formula behind
// every figure (POST /api/predict).
import { COMPONENT_COLORS, layout, plot } from "./charts.js";
import { $, el, esc, fmtBytes, fmtPct, fmtSeconds } from "./dom.js";
import { axisUnit, fmt } from "./units.js";

function card(label, value, sub, bad = false) {
  return el("div", { class: `card${bad ? " bad" : ""}`, dataset: { card: label } },
    el("div", { class: "label", text: label }), el("div", { class: "value", text: value }),
    sub ? el("div", { class: "sub", text: sub }) : null);
}

function formulaRows(pred) {
  const rows = [];
  for (const section of ["memory", "comm", "step", "pipeline"]) {
    const explain = pred[section]?.explain || {};
    for (const [key, f] of Object.entries(explain)) {
      if (!f || typeof f !== "object" || !("formula" in f)) continue;
      const value = f.value === null || f.value === undefined ? "–"
        : f.unit === "bytes" ? fmtBytes(f.value)
          : f.unit === "s" ? fmtSeconds(f.value)
            : f.unit === "fraction" ? fmtPct(f.value, true) : fmt(f.value, f.unit || "");
      const inputs = Object.entries(f.inputs || {}).map(([k, v]) =>
        `${k}=${typeof v === "number" ? Number(v.toPrecision(6)) : JSON.stringify(v)}`).join(", ");
      rows.push(el("tr", { title: f.convention || "" }, el("td", { text: `${section}.${key}` }),
        el("td", { class: "num", text: value }), el("td", { text: f.formula }),
        el("td", { text: inputs })));
    }
  }
  return rows;
}

// comm.links: each mesh axis's bytes per rank per step, the link its groups cross (intra- or
// inter-host) and the time on that link's bus bandwidth (jobs/theory/links.py). Without a
// what-if figure the busbw is a nominal GPU link's (NVLink 900 GB/s, InfiniBand 50 GB/s):
// the cell says "assumed", as it is no host's measured link (issue 37).
const assumedLink = (r) => String(r.bandwidth_source || "").startsWith("default");
function linkRows(links) {
  return (links?.per_axis || []).filter((r) => r.group_size > 1).map((r) =>
    el("tr", { dataset: { axis: r.axis, link: r.link }, title: r.bandwidth_source },
      el("td", { text: r.axis }), el("td", { text: r.link }),
      el("td", { class: "num", text: `${r.groups_crossing} of ${r.groups}` }),
      el("td", { class: "num", text: fmtBytes(r.bytes_per_rank) }),
      el("td", { class: "num", dataset: { assumed: assumedLink(r) ? "1" : "0" },
        text: fmt(r.busbw_GBps * 1e9, "B/s") + (assumedLink(r) ? " (assumed)" : "") }),
      el("td", { class: "num", text: fmtSeconds(r.time_s) })));
}

// The panel's what-if inputs as POST /api/predict `assumptions` (null when none is set): the
// spec's world split over `nnodes` hosts, and each link's bus bandwidth.
export const WHATIF_INPUTS = { nnodes: "#whatif-nnodes", intra_bandwidth_GBps: "#whatif-intra",
  inter_bandwidth_GBps: "#whatif-inter" };

export function whatIfAssumptions() {
  const out = {};
  for (const [key, sel] of Object.entries(WHATIF_INPUTS)) {
    const v = $(sel)?.value;
    if (v !== undefined && v !== "") out[key] = Number(v);
  }
  return Object.keys(out).length ? out : null;
}

export function renderLinks(links) {
  const tbl = $("#pred-links");
  if (!tbl) return;
  const rows = linkRows(links);
  const assumed = (links?.per_axis || []).some((r) => r.group_size > 1 && assumedLink(r));
  $("#pred-links-caption").textContent = links
    ? `${links.nnodes} host${links.nnodes > 1 ? "s" : ""} × ${links.nproc_per_node} ranks; ` +
      links.convention + (assumed ? "; busbw (assumed): a nominal GPU link's, not this " +
        "host's — set intra / inter GB/s above to your measured figures" : "") : "";
  tbl.querySelector("tbody").replaceChildren(...rows);
  tbl.hidden = !rows.length;
}

export function renderPrediction(pred, deviceBytes) {
  const mem = pred.memory || {};
  const perRank = mem.per_rank_bytes;
  const over = deviceBytes > 0 && perRank > deviceBytes;
  const comm = pred.comm;
  const pipe = pred.pipeline;
  const cards = [
    card("peak memory per rank", fmtBytes(perRank),
      deviceBytes > 0 ? `${fmtPct((100 * perRank) / deviceBytes)} of ${fmtBytes(deviceBytes)}`
        : null, over),
    comm ? card("comm per step (rank)", fmtBytes(comm.bytes_per_rank),
      comm.time_lower_bound_s ? `≥ ${fmtSeconds(comm.time_lower_bound_s)}` : comm.convention)
      : null,
    pipe?.p > 1 ? card("bubble fraction", fmtPct(pipe.bubble_fraction, true),
      `${pipe.schedule}, p=${pipe.p} m=${pipe.m} v=${pipe.v}`) : null,
    pred.step?.time_no_overlap_s ? card("step time", fmtSeconds(pred.step.time_no_overlap_s),
      "no overlap") : null,
    card("parameters", fmt(pred.params?.total ?? 0, ""),
      pred.params?.per_rank ? `${fmt(pred.params.per_rank, "")} per rank` : null),
  ];
  $("#pred-cards").replaceChildren(...cards.filter(Boolean));
  if (over) {
    $("#pred-cards").append(el("p", { class: "error", role: "alert",
      text: `Predicted ${fmtBytes(perRank)} per rank exceeds the device's ${fmtBytes(deviceBytes)}.` }));
  }

  const comps = Object.entries(mem.components || {});
  // The device line is drawn only when it is on the bars' scale (within 20x of the prediction);
  // otherwise the bars would be invisible slivers: the card says how much of the device it is.
  const onScale = deviceBytes > 0 && perRank > 0 && deviceBytes <= 20 * perRank;
  const u = axisUnit([perRank || 0, onScale ? deviceBytes : 0], "B");
  const memTraces = comps.map(([name, bytes]) => ({
    type: "bar", orientation: "h", name: esc(name), y: ["busiest rank"], x: [bytes / u.div],
    marker: { color: COMPONENT_COLORS[name] }, text: [`${esc(name)}: ${fmtBytes(bytes)}`],
    textposition: "none", hovertemplate: "%{text}<extra></extra>",
  }));
  const memLayout = layout("Memory per rank by component", u.title("memory"), "", {
    barmode: "stack", margin: { l: 90, r: 10, t: 35, b: 100 },
    legend: { orientation: "h", y: -0.62, yanchor: "top" },
    shapes: onScale ? [{ type: "line", x0: deviceBytes / u.div, x1: deviceBytes / u.div,
      y0: -0.5, y1: 0.5, line: { color: "#b00020", dash: "dash", width: 2 } }] : [],
    annotations: onScale ? [{ x: deviceBytes / u.div, y: 0.5, text: "device memory",
      showarrow: false, yanchor: "bottom", font: { color: "#b00020", size: 11 } }] : [],
    xaxis: { range: [0, Math.max(perRank || 0, onScale ? deviceBytes : 0) / u.div * 1.08] },
  });
  plot($("#pred-memory"), memTraces, memLayout);

  const axes = Object.entries(comm?.components || {});
  if (axes.length) {
    const cu = axisUnit(axes.map(([, b]) => b), "B");
    plot($("#pred-comm"), [{ type: "bar", x: axes.map(([a]) => a), y: axes.map(([, b]) => b / cu.div),
      name: "bytes sent per rank", marker: { color: "#4e79a7" },
      text: axes.map(([a, b]) => `${esc(a)}: ${fmtBytes(b)}`), textposition: "none",
      hovertemplate: "%{text}<extra></extra>" }],
    layout("Communication per step by mesh axis", "mesh axis", cu.title("sent per rank"),
      { margin: { l: 60, r: 10, t: 35, b: 100 }, legend: { y: -0.5 } }));
  } else {
    $("#pred-comm").replaceChildren();
  }
  renderLinks(comm?.links);
  $("#pred-formulas tbody").replaceChildren(...formulaRows(pred));
}
