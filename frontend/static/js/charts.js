// Plotly defaults shared by every chart (plotly.js is served locally as a classic script).
export const Plotly = window.Plotly;

export const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
export const COMPONENT_COLORS = { params: "#4e79a7", grads: "#f28e2b", optimizer: "#59a14f",
  activations: "#e15759", gathered: "#b07aa1", gathered_peak: "#b07aa1",
  gathered_unit: "#b07aa1", buffers: "#76b7b2", recv_buffers: "#76b7b2", comm_buffers: "#edc948",
  allocator: "#9c755f" }; // allocator: an imported profile's allocator total (not split)

// A colour means one thing on every page and every run (issue 37): a mesh axis keeps its
// colour whichever axes a run has and in whatever order its table lists them (dp is never
// blue on one run and orange on the next). A name outside the map gets a colour from its
// letters, so it too is the same on every page.
export const AXIS_COLORS = { dp: "#4e79a7", tp: "#f28e2b", pp: "#59a14f", ep: "#e15759",
  edp: "#b07aa1", cp: "#76b7b2", sp: "#9c755f", all: "#79706e" };
const SPARE = ["#edc948", "#ff9da7", "#bab0ac", "#17becf", "#8c564b", "#bcbd22"];

export function colorOf(name, map = AXIS_COLORS) {
  if (name in map) return map[name];
  let h = 0;
  for (const ch of String(name)) h = (h * 31 + ch.codePointAt(0)) >>> 0;
  return SPARE[h % SPARE.length];
}

// the collective op of a series (bandwidth curves): a marker shape per op, the colour its axis
export const OP_SYMBOLS = { all_reduce: "circle", reduce_scatter: "square", all_gather: "diamond",
  broadcast: "triangle-up", reduce: "triangle-down", all_to_all: "x", send_recv: "cross",
  send: "cross", recv: "cross" };

export function layout(title, xTitle, yTitle, extra = {}) {
  return {
    title: { text: title, font: { size: 15 } },
    margin: { l: 70, r: 20, t: 45, b: 80 },
    xaxis: { title: { text: xTitle }, automargin: true, ...(extra.xaxis || {}) },
    yaxis: { title: { text: yTitle }, automargin: true, ...(extra.yaxis || {}) },
    legend: { orientation: "h", y: -0.3, yanchor: "top", ...(extra.legend || {}) },
    hoverlabel: { namelength: -1 },
    showlegend: true,
    ...Object.fromEntries(Object.entries(extra).filter(([k]) => !["xaxis", "yaxis",
      "legend"].includes(k))),
  };
}

export const CONFIG = { responsive: true, displaylogo: false };

// Steps are whole numbers: on a short run Plotly's automatic ticks would fall on halves
// ("0.5, 1.5"), so an axis titled "step" spanning at most 10 steps gets a tick per step.
function stepTicks(data, lay) {
  if (lay?.xaxis?.title?.text !== "step" || lay.xaxis.dtick !== undefined) return lay;
  const xs = data.flatMap((t) => (Array.isArray(t.x) ? t.x : [])).filter(Number.isFinite);
  if (!xs.length || Math.max(...xs) - Math.min(...xs) > 10) return lay;
  return { ...lay, xaxis: { ...lay.xaxis, dtick: 1, tick0: 0 } };
}

export async function plot(div, data, lay, config = {}) {
  if (div.classList.contains("empty")) { // it held a message (emptyChart): a live page redraws
    div.classList.remove("empty");
    div.replaceChildren();
  }
  await Plotly.react(div, data, stepTicks(data, lay), { ...CONFIG, ...config });
  div.dataset.ready = "1";
  return div;
}

export function emptyChart(div, message) {
  if (div.data) Plotly.purge(div); // it held a chart: drop Plotly's state with it
  div.replaceChildren();
  div.classList.add("empty");
  div.textContent = message;
}
