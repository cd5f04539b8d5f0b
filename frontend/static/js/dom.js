// DOM and formatting helpers. Data only ever reaches the page through textContent / attributes;
// `esc` is for strings placed into Plotly text (which renders a subset of HTML).

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export const $ = (sel, root = document) => root.querySelector(sel);

export function esc(s) {
  return String(s ?? "").replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// Numbers are formatted by units.js (one rule, shared with the CLI's jobs/units.py).
export { fmtBytes, fmtPct, fmtTime as fmtSeconds } from "./units.js";

export const fmtNum = (x, d = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

export function fmtDate(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}`, text: status, dataset: { status } });
}

export function degrees(r) {
  return `dp${r.dp}·tp${r.tp}·pp${r.pp}`;
}

// Every degree of a run (the run page and the list): ep and cp only when they are used (> 1),
// from the run's columns, else its spec (an older server's answer)
export function allDegrees(r) {
  const par = r.spec?.parallel || {};
  const extra = ["ep", "cp"].map((k) => [k, Number(r[k] ?? par[k] ?? 1)])
    .filter(([, v]) => v > 1).map(([k, v]) => `·${k}${v}`).join("");
  return degrees(r) + extra;
}

export function showError(target, e) {
  target.replaceChildren(el("p", { class: "error", role: "alert", text: e?.message || String(e) }));
}
