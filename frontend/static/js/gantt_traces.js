// The timeline's Plotly traces (gantt.js draws them): a colour per span category, nested
// compute spans thinner, idle gaps shaded, the simulated schedule under a pipeline step. Kept
// apart from the Gantt class so each file stays small.
import { esc } from "./dom.js";
import { fmt } from "./units.js";

// category -> colour; each colour used once (the legend and the tests rely on it)
export const CATEGORIES = {
  forward: "#4e79a7", backward: "#f28e2b", "backward (input)": "#ffbe7d",
  "backward (weight)": "#b6992d", "forward.layer": "#a0cbe8", "backward.layer": "#d4a6c8",
  optimizer: "#59a14f", "other compute": "#9aa3b2", grad_sync: "#79706e", wait_grads: "#d7b5a6",
  all_reduce: "#e15759", reduce_scatter: "#76b7b2", all_gather: "#b07aa1", broadcast: "#9c755f",
  reduce: "#ff9da7", all_to_all: "#17becf", send: "#1f3b73", recv: "#006d2c",
  "other comm": "#636363", "many spans": "#2b2b2b", idle: "#fbd3d0",
  // imported GPU traces: a lane per stream (jobs/kineto/convert.py)
  "GPU kernel": "#8cd17d", "memcpy / memset": "#f1ce63",
};
const DEPTH_W = [14, 8, 5, 3]; // line width by nesting depth in a lane
const COMM_W = 8;

const onStream = (channel) => channel.startsWith("stream ");

export function categoryOf(name, channel) {
  if (channel === "compute") return name in CATEGORIES ? name : "other compute";
  if (onStream(channel)) {
    if (name in CATEGORIES) return name; // a collective's kernel, named by its op
    return /^(Memcpy|Memset)/.test(name) ? "memcpy / memset" : "GPU kernel";
  }
  if (channel === "sync") return name in CATEGORIES ? name : "grad_sync";
  return name in CATEGORIES ? name : "other comm";
}

// WebGL pays a fixed cost per draw (a context, shaders: about 0.4 s in a browser without a
// GPU, docs/benchmarks.md) that SVG does not; SVG's cost grows with the points. Below this many
// segments and idle gaps SVG draws first; above, WebGL.
const SVG_MAX = 3000;

export function lineType(data) {
  return data.returned + data.idle.t0.length <= SVG_MAX ? "scatter" : "scattergl";
}

export function segmentTraces(data, query) {
  const s = data.segments;
  const lanes = data.lanes;
  const groups = new Map();
  for (let i = 0; i < s.t0.length; i++) {
    const lane = lanes[s.lane[i]];
    const name = data.keys[s.key[i]] ?? "?";
    const merged = s.n[i] > 1;
    const cat = merged ? "many spans" : categoryOf(name, lane.channel);
    const nested = lane.channel === "compute" || onStream(lane.channel);
    const depth = nested ? s.depth[i] : 0;
    const hit = !query || name.toLowerCase().includes(query);
    const gk = `${cat}|${depth}|${hit}`;
    let g = groups.get(gk);
    if (!g) {
      g = { cat, depth, hit, x: [], y: [], custom: [],
        width: nested ? DEPTH_W[depth] : COMM_W };
      groups.set(gk, g);
    }
    const y = lane.y;
    g.x.push(s.t0[i], (s.t0[i] + s.t1[i]) / 2, s.t1[i], null);
    g.y.push(y, y, y, null);
    g.custom.push(i, i, i, null);
  }
  const seen = new Set();
  return [...groups.values()].sort((a, b) => a.depth - b.depth).map((g) => {
    const first = !seen.has(g.cat);
    seen.add(g.cat);
    return { type: lineType(data), mode: "lines", name: esc(g.cat), x: g.x, y: g.y,
      customdata: g.custom, line: { color: CATEGORIES[g.cat], width: g.width },
      opacity: g.hit ? 1 : 0.15, legendgroup: g.cat, showlegend: first,
      hovertemplate: "%{text}<extra></extra>", text: g.custom.map((i) => (i === null ? null
        : hoverText(data, i))) };
  });
}

function hoverText(data, i) {
  const s = data.segments;
  const name = esc(data.keys[s.key[i]] ?? "?");
  const dur = (s.t1[i] - s.t0[i]) / 1e3;
  return `${s.n[i] > 1 ? `${s.n[i]} spans merged (longest: ${name})` : name}` +
    `${s.mb[i] >= 0 ? ` · mb ${s.mb[i]}` : ""} · step ${s.step[i]} · rank ${s.rank[i]}<br>` +
    `${fmt(dur, "s")}${s.bytes[i] ? ` · ${fmt(s.bytes[i], "B")}` : ""}`;
}

export function idleTrace(data) {
  const x = [];
  const y = [];
  // a rank's compute lane, or its first lane (an imported GPU trace has stream lanes)
  const compute = new Map();
  for (const l of data.lanes) {
    if (!compute.has(l.rank) || l.channel === "compute") compute.set(l.rank, l.y);
  }
  const d = data.idle;
  for (let i = 0; i < d.t0.length; i++) {
    const yy = compute.get(d.rank[i]) ?? 0;
    x.push(d.t0[i], d.t1[i], null);
    y.push(yy, yy, null);
  }
  return { type: lineType(data), mode: "lines", name: "idle", x, y, hoverinfo: "skip",
    line: { color: CATEGORIES.idle, width: DEPTH_W[0] + 4 }, legendgroup: "idle" };
}

const THEORY_CAT = { F: "forward", B: "backward (input)", W: "backward (weight)", BW: "backward" };

export function theoryTraces(theory, base, type) {
  const groups = new Map();
  theory.rows.forEach((row, i) => {
    const y = base + i;
    for (const s of row.spans) {
      const cat = THEORY_CAT[s.kind] || "other compute";
      let g = groups.get(cat);
      if (!g) { g = { cat, x: [], y: [], text: [] }; groups.set(cat, g); }
      const t = `simulated ${s.kind}${s.mb}${s.chunk ? ` chunk ${s.chunk}` : ""} · pp${row.pp}<br>` +
        `${fmt((s.t1_ms - s.t0_ms) / 1e3, "s")}`;
      g.x.push(s.t0_ms, (s.t0_ms + s.t1_ms) / 2, s.t1_ms, null);
      g.y.push(y, y, y, null);
      g.text.push(t, t, t, null);
    }
  });
  return [...groups.values()].map((g) => ({
    type, mode: "lines", name: esc(g.cat), x: g.x, y: g.y, text: g.text,
    line: { color: CATEGORIES[g.cat], width: DEPTH_W[1] + 3 }, legendgroup: g.cat,
    showlegend: false, hovertemplate: "%{text}<extra></extra>", meta: "theory" }));
}
