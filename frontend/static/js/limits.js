// The quotas that bind the caller (backend/quotas.py, GET /api/users/{name}/limits): shown
// above the new-run form, and its timeout fields checked against the admin's bounds before
// submit (the server checks them again). Every value goes into textContent.
import { $ } from "./dom.js";

const hours = (h) => (Math.round(h * 100) / 100).toString();

function span(s) {
  for (const [unit, n] of [["day", 86400], ["hour", 3600], ["minute", 60]]) {
    if (s >= n && s % n === 0) return `${s / n} ${unit}${s === n ? "" : "s"}`;
  }
  return `${s} s`;
}

export function renderLimits(l) {
  const parts = [];
  if (l.max_timeout_s != null) parts.push(`runtime.timeout_s ≤ ${l.max_timeout_s} s`);
  if (l.min_hang_timeout_s != null) {
    parts.push(`runtime.hang_timeout_s ≥ ${l.min_hang_timeout_s} s (the hang watch stays on)`);
  }
  if (l.bounds_exempt) parts.push("no timeout bounds (admin)");
  parts.push(`world size ≤ ${l.max_world_size}`);
  parts.push(l.max_concurrent_runs != null
    ? `${l.active_runs} of ${l.max_concurrent_runs} runs queued or running`
    : `${l.active_runs} runs queued or running`);
  if (l.max_slot_hours != null) {
    parts.push(`slot-hours ${hours(l.slot_hours_used + l.slot_hours_reserved)} of ` +
      `${l.max_slot_hours} over ${span(l.window_s)} (used ${hours(l.slot_hours_used)}, ` +
      `reserved by queued and running runs ${hours(l.slot_hours_reserved)}; a new run ` +
      "reserves world size × timeout_s)");
  }
  const box = $("#limits");
  box.textContent = `Your limits: ${parts.join(" · ")}`;
  box.hidden = false;
  const t = $("#f-runtime-timeout_s");
  if (t && l.max_timeout_s != null) t.max = Math.min(Number(t.max) || Infinity, l.max_timeout_s);
  const h = $("#f-runtime-hang_timeout_s");
  if (h && l.min_hang_timeout_s != null) h.min = l.min_hang_timeout_s;
}

// 422-shaped entries ({loc, msg}) for the bounds the spec breaks; `value(path)` reads the form.
export function boundErrors(l, value) {
  if (!l) return [];
  const out = [];
  const t = value("runtime.timeout_s");
  const h = value("runtime.hang_timeout_s");
  if (l.max_timeout_s != null && t > l.max_timeout_s) {
    out.push({ loc: ["body", "runtime", "timeout_s"], msg: `at most ${l.max_timeout_s} s on ` +
      `this server (the admin sets ${l.settings.quota_max_timeout_s})` });
  }
  if (l.min_hang_timeout_s != null && h < l.min_hang_timeout_s) {
    out.push({ loc: ["body", "runtime", "hang_timeout_s"], msg: `at least ` +
      `${l.min_hang_timeout_s} s on this server` + (h === 0 ? " (0 turns the hang watch off)"
      : "") + ` (the admin sets ${l.settings.quota_min_hang_timeout_s})` });
  }
  return out;
}
