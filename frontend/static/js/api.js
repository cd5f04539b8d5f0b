// Every request the front end makes goes through this module.
async function request(method, path, body) {
  const opts = { method, headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const data = r.headers.get("content-type")?.includes("json") ? await r.json() : await r.text();
  if (r.status === 401 && !path.startsWith("/api/auth/")) {
    location.href = `/login?next=${encodeURIComponent(location.pathname + location.search)}`;
  }
  if (!r.ok) {
    const err = new Error(`HTTP ${r.status}: ${formatErrors(data?.detail ?? data)}`);
    err.status = r.status;
    err.detail = data && data.detail !== undefined ? data.detail : data;
    throw err;
  }
  return data;
}

const enc = encodeURIComponent;
const qs = (params) => {
  const clean = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return clean.length ? "?" + new URLSearchParams(clean) : "";
};

// A table from the analysis endpoints: a list of row objects, or {columns, rows: [[...]]}.
export function rowsOf(table) {
  if (!table) return [];
  if (Array.isArray(table)) {
    if (table.length && Array.isArray(table[0])) return [];
    return table;
  }
  const rows = table.rows || table.data || [];
  if (rows.length && Array.isArray(rows[0]) && table.columns) {
    return rows.map((r) => Object.fromEntries(table.columns.map((c, i) => [c, r[i]])));
  }
  return rows;
}

async function optional(promise) {
  try { return await promise; } catch (e) { if (e.status === 404) return null; throw e; }
}

const metricsCache = {};

export const api = {
  presets: () => request("GET", "/api/presets"),
  specFields: () => request("GET", "/api/spec"),
  workers: () => request("GET", "/api/workers"),
  runs: (params = {}) => request("GET", "/api/runs" + qs(params)),
  run: (id) => request("GET", `/api/runs/${enc(id)}`),
  submit: (spec) => request("POST", "/api/runs", spec),
  cancel: (id) => request("POST", `/api/runs/${enc(id)}/cancel`),
  predict: (spec) => request("POST", "/api/predict", { spec }),
  files: (id) => request("GET", `/api/runs/${enc(id)}/files`),
  logStream: (id, rank) => new EventSource(`/api/runs/${enc(id)}/logs/stream` + qs({ rank })),
  ganttSteps: (id) => request("GET", `/api/runs/${enc(id)}/gantt/steps`),
  gantt: (id, params = {}) => request("GET", `/api/runs/${enc(id)}/gantt` + qs(params)),
  breakdown: (id) => optional(request("GET", `/api/runs/${enc(id)}/breakdown`)),
  comm: (id) => optional(request("GET", `/api/runs/${enc(id)}/comm`)),
  sweeps: (ids) => request("GET", "/api/sweeps" + qs({ ids: ids?.join(",") })),
  schedules: () => request("GET", "/api/schedules"),
  exploreSchedule: (params) => request("GET", "/api/schedules/explore" + qs(params)),
  // The analysis (issue 5) of a finished run, fetched once per page.
  metrics(id) {
    metricsCache[id] ??= optional(request("GET", `/api/runs/${enc(id)}/metrics`));
    return metricsCache[id];
  },
  // Memory rows {rank, component, measured_bytes, predicted_bytes, error_pct}: the analysis
  // endpoint's table when it has one, else the dashboard's own view of the trace + theory.
  async memory(id) {
    let metrics = null;
    try { metrics = await api.metrics(id); } catch { metrics = null; }
    const rows = rowsOf(metrics?.tables?.memory);
    if (rows.length && rows[0].measured_bytes !== undefined) return { rows, source: "metrics" };
    return optional(request("GET", `/api/runs/${enc(id)}/memory`));
  },
  tableUrl: (id, name, fmt) => `/api/runs/${enc(id)}/tables/${enc(name)}.${fmt}`,
  exportUrl: (id, format, table) => `/api/runs/${enc(id)}/export` + qs({ format, table }),
  fileUrl: (id, path) => `/api/runs/${enc(id)}/files/${path.split("/").map(enc).join("/")}`,
};

export function formatErrors(detail) {
  if (Array.isArray(detail)) {
    return detail.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("\n");
  }
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}
