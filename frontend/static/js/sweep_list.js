// The sweeps page (/sweeps): the sweep builder (sweep_builder.js), then the list, newest first,
// filtered by text and status (GET /api/sweeps).
import { api } from "./api.js";
import { $, el, fmtDate, statusBadge } from "./dom.js";
import { mountBuilder } from "./sweep_builder.js";

const counts = (c) => Object.entries(c).filter(([k]) => k !== "total")
  .map(([k, n]) => `${n} ${k}`).join(", ") + ` (of ${c.total})`;

async function load() {
  const body = $("#sweeps-table tbody");
  $("#sweeps-error").textContent = "";
  let page;
  try {
    page = await api.sweeps({ q: $("#sweeps-q").value.trim(), status: $("#sweeps-status").value,
      limit: 200 });
  } catch (e) { $("#sweeps-error").textContent = e.message; return; }
  body.replaceChildren(...page.items.map((s) => el("tr", { dataset: { id: s.id } },
    el("td", {}, el("a", { href: `/sweeps/${encodeURIComponent(s.id)}`, text: s.name })),
    el("td", {}, statusBadge(s.status)), el("td", { text: s.owner }),
    el("td", { text: counts(s.counts) }), el("td", { text: fmtDate(s.created_at) }))));
  if (!page.items.length) body.append(el("tr", {}, el("td", { colspan: 5, text: "no sweeps" })));
}

$("#sweeps-filters").addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
load();
mountBuilder();
