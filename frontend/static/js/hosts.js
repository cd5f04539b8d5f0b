// A multi-host run's hosts (runtime.nnodes > 1): its nodes as the backend placed and supervised
// them (run.nodes: host, worker, ranks, status), why it still waits for hosts
// (run.placement_wait), and which rank ran where as the ranks themselves traced it (the
// analysis `placement` table: host, torch's node rank, local rank, mesh coordinates and the
// bound of the clock alignment). Every server string reaches the page through textContent.
import { table } from "./analysis.js";
import { el, fmtDate } from "./dom.js";
import { fmt } from "./units.js";

const dash = (v) => (v === null || v === undefined || v === "" ? "–" : String(v));

function nodesTable(nodes) {
  const head = ["node", "host", "worker", "ranks", "status", "started", "ended", "error"];
  return el("table", { class: "data compact", id: "hosts-nodes" },
    el("thead", {}, el("tr", {}, ...head.map((t) => el("th", { text: t })))),
    el("tbody", {}, ...nodes.map((n) => el("tr", { dataset: { node: String(n.node),
      host: String(n.host), status: String(n.status) } },
    el("td", { text: String(n.node) }), el("td", { class: "host-name", text: dash(n.host) }),
    el("td", { text: dash(n.worker) }), el("td", { text: dash(n.ranks) }),
    el("td", { text: dash(n.status) }),
    el("td", { text: n.started_at ? fmtDate(n.started_at) : "–" }),
    el("td", { text: n.finished_at ? fmtDate(n.finished_at) : "–" }),
    el("td", { class: "pre", text: dash(n.error) })))));
}

function ranksTable(rows) {
  const head = ["rank", "host", "node rank", "local rank", "pp", "dp", "tp", "clock bound"];
  return el("table", { class: "data compact", id: "hosts-ranks" },
    el("thead", {}, el("tr", {}, ...head.map((t) => el("th", { text: t })))),
    el("tbody", {}, ...rows.map((r) => el("tr", { dataset: { rank: String(r.rank),
      host: String(r.host) } },
    el("td", { text: String(r.rank) }), el("td", { text: dash(r.host) }),
    el("td", { text: dash(r.node_rank) }), el("td", { text: dash(r.local_rank) }),
    el("td", { text: dash(r.pp) }), el("td", { text: dash(r.dp) }), el("td", { text: dash(r.tp) }),
    el("td", { text: r.clock_error_ns === null || r.clock_error_ns === undefined ? "–"
      : `±${fmt(Number(r.clock_error_ns) / 1e9, "s")}` })))));
}

export function mountHosts(run, analysis, section, box) {
  const multi = (run.nnodes || 1) > 1;
  section.hidden = !multi;
  if (!multi) return;
  const parts = [el("p", { class: "muted", text: `${run.nnodes} hosts × `
    + `${run.spec?.runtime?.nproc_per_node ?? "?"} ranks, one c10d rendezvous; torch numbers `
    + "the nodes in its own order (sorted addresses, then process ids), shown per rank below" })];
  if (run.placement_wait) {
    parts.push(el("p", { id: "hosts-wait", class: "reason", text: run.placement_wait }));
  }
  if (run.nodes?.length) parts.push(nodesTable(run.nodes));
  const ranks = table(analysis, "placement");
  if (ranks.length) parts.push(el("h3", { text: "Ranks" }), ranksTable(ranks));
  box.replaceChildren(...parts);
}
