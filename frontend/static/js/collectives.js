// The collectives page: the latest sweeps with checkboxes; the checked ones overlaid.
import { api } from "./api.js";
import { $, el, fmtDate, fmtNum } from "./dom.js";
import { mountSweepChart } from "./sweeps.js";

const params = new URLSearchParams(location.search);

async function init() {
  let sweeps;
  try { sweeps = await api.collectiveSweeps(); } catch (e) { $("#coll-error").textContent = e.message; return; }
  const wanted = new Set((params.get("ids") || "").split(",").filter(Boolean));
  if (!wanted.size) sweeps.slice(0, 3).forEach((s) => wanted.add(s.id));
  const table = $("#sweeps");
  const redraw = () => {
    const ids = [...table.querySelectorAll("input:checked")].map((b) => b.value);
    history.replaceState(null, "", ids.length ? `/collectives?ids=${ids.join(",")}` : "/collectives");
    if (ids.length) mountSweepChart($("#coll-chart"), ids, $("#coll-time"));
  };
  table.replaceChildren(el("thead", {}, el("tr", {}, ...["", "sweep", "created", "backend",
    "device", "ranks", "ops", "copy GB/s"].map((h) => el("th", { text: h })))),
  el("tbody", {}, ...sweeps.map((s) => {
    const box = el("input", { type: "checkbox", value: s.id, "aria-label": `overlay ${s.id}` });
    box.checked = wanted.has(s.id);
    box.addEventListener("change", redraw);
    return el("tr", {}, el("td", {}, box),
      el("td", {}, el("a", { href: `/runs/${encodeURIComponent(s.id)}`, text: s.name }),
        el("span", { class: "muted id", text: ` ${s.id}` })),
      el("td", { text: fmtDate(s.created_at) }), el("td", { text: s.backend ?? "–" }),
      el("td", { text: s.device ?? "–" }), el("td", { text: s.world_size }),
      el("td", { text: [...new Set(s.results.map((r) => `${r.op}/${r.algorithm}`))].join(", ") }),
      el("td", { class: "num", text: fmtNum(s.copy_bandwidth_GBps) }));
  })));
  if (!sweeps.length) {
    $("#coll-chart").textContent = "No collective sweeps yet: submit one with the collective-sweep preset.";
    $("#coll-chart").classList.add("empty");
    return;
  }
  redraw();
}

init();
