// The cluster page: live hosts with their devices, slots and the runs holding them; queued runs
// and what each waits for (GET /api/cluster, backend/services/cluster.py). Refreshes every few
// seconds while visible. Every string from the server reaches the page through textContent.
import { api } from "./api.js";
import { $, el, fmtBytes, fmtDate, fmtSeconds } from "./dom.js";

const REFRESH_MS = 3000;

const runLink = (r) => el("a", { href: `/runs/${encodeURIComponent(r.id)}`, text: r.name,
  dataset: { runId: r.id } });

function slotsBar(h) {
  // one cell per slot: busy ones filled, so the free share reads at a glance
  const bar = el("span", { class: "slots-bar", role: "img",
    "aria-label": `${h.busy} of ${h.slots} slots busy, ${h.free} free` });
  for (let i = 0; i < Math.min(h.slots, 64); i++) {
    bar.append(el("span", { class: i < h.busy ? "slot busy" : "slot free" }));
  }
  return el("div", { class: "slots" }, bar,
    el("span", { class: "slots-text", text: `${h.busy} busy / ${h.free} free of ${h.slots}` }));
}

function device(d) {
  const mem = d.memory_bytes ? ` · ${fmtBytes(d.memory_bytes)}` : "";
  const idx = d.type === "cuda" && d.index !== null ? `${d.index}: ` : "";
  return el("li", { dataset: { deviceType: d.type }, text: `${d.type} ${idx}${d.name}${mem}` });
}

function hostRow(h) {
  const runs = h.runs.length
    ? el("ul", { class: "plain" }, h.runs.map((r) => el("li", {}, runLink(r),
      el("span", { class: "muted", text: ` ${r.world_size} ranks · ${r.worker ?? ""}` }))))
    : el("span", { class: "muted", text: "none" });
  // the nodes of multi-host runs holding this host's ranks (gang placement)
  const held = h.held_by.length
    ? el("ul", { class: "plain held-by" }, h.held_by.map((n) => el("li", {
      dataset: { runId: n.run, node: String(n.node) } },
      el("a", { href: `/runs/${encodeURIComponent(n.run)}`, text: n.run }),
      el("span", { class: "muted", text: ` node ${n.node} · ${n.ranks} ranks · ${n.status}` }))))
    : null;
  const workers = el("ul", { class: "plain" }, h.workers.map((w) => el("li", {
    text: `${w.name} (${w.queue}): ${w.busy}/${w.slots} busy` })));
  return el("tr", { dataset: { host: h.host } },
    el("th", { scope: "row", class: "host-name", text: h.host }),
    el("td", { text: h.queues.join(", ") }),
    el("td", {}, el("ul", { class: "plain devices" }, h.devices.map(device))),
    el("td", {}, slotsBar(h)),
    el("td", { class: "host-runs" }, runs, held),
    el("td", {}, workers));
}

function queuedRow(r) {
  return el("tr", { dataset: { runId: r.id, queue: r.queue } },
    el("td", {}, runLink(r), el("span", { class: "muted id", text: ` ${r.id}` })),
    el("td", { text: r.queue }),
    el("td", { text: r.nnodes > 1 ? `${r.world_size} (${r.nnodes} hosts)` : `${r.world_size}` }),
    el("td", { text: `${fmtDate(r.waiting_since)} (${fmtSeconds(r.waited_s)})` }),
    el("td", { class: "reason" }, el("span", { text: r.reason }),
      r.placement.length ? el("div", { class: "muted placement", text: "placed: "
        + r.placement.map((p) => `node ${p.node} on ${p.host}`).join(", ") }) : null));
}

function queueRow(q) {
  return el("tr", { dataset: { queue: q.queue } },
    el("td", { text: q.queue }), el("td", { text: q.hosts.join(", ") || "–" }),
    el("td", { text: String(q.workers) }), el("td", { text: `${q.busy} / ${q.slots}` }),
    el("td", { text: String(q.queued) }));
}

function render(c) {
  $("#hosts tbody").replaceChildren(...c.hosts.map(hostRow));
  const noHosts = $("#hosts-empty");
  noHosts.hidden = c.hosts.length > 0;
  noHosts.textContent = `No live worker: none has reported in the last ${c.worker_alive_s} s. `
    + "Start one with `paralab worker` (docs/deploy.md).";
  $("#unseen").replaceChildren(...(c.running_unseen.length ? [
    el("p", { class: "error", text: "Running on a worker that has stopped reporting "
      + "(it will be failed as worker lost if it stays silent):" }),
    el("ul", {}, c.running_unseen.map((r) => el("li", {}, runLink(r),
      el("span", { class: "muted", text: ` on ${r.worker ?? "?"}` }))))] : []));
  $("#queued tbody").replaceChildren(...c.queued.map(queuedRow));
  const noQueued = $("#queued-empty");
  noQueued.hidden = c.queued.length > 0;
  noQueued.textContent = "No run is waiting.";
  if (c.queued_total > c.queued.length) {
    noQueued.hidden = false;
    noQueued.textContent = `${c.queued_total - c.queued.length} more queued runs not shown.`;
  }
  $("#queues tbody").replaceChildren(...c.queues.map(queueRow));
  $("#cluster-updated").textContent = `updated ${fmtDate(c.generated_at)}`;
  document.body.dataset.ready = "1";
}

async function load() {
  try {
    render(await api.cluster());
    $("#cluster-error").textContent = "";
  } catch (e) {
    $("#cluster-error").textContent = e.message;
  }
}

load();
setInterval(() => { if (!document.hidden) load(); }, REFRESH_MS);
