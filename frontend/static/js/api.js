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

async function optional(promise) {
  try { return await promise; } catch (e) { if (e.status === 404) return null; throw e; }
}

const metricsCache = {};

export const api = {
  presets: () => request("GET", "/api/presets"),
  me: () => request("GET", "/api/auth/me"),
  limits: (user) => request("GET", `/api/users/${enc(user)}/limits`),
  specFields: () => request("GET", "/api/spec"),
  workers: () => request("GET", "/api/workers"),
  cluster: () => request("GET", "/api/cluster"),
  runs: (params = {}) => request("GET", "/api/runs" + qs(params)),
  run: (id) => request("GET", `/api/runs/${enc(id)}`),
  submit: (spec) => request("POST", "/api/runs", spec),
  cancel: (id) => request("POST", `/api/runs/${enc(id)}/cancel`),
  checkpoints: (id) => request("GET", `/api/runs/${enc(id)}/checkpoints`),
  resume: (id, body) => request("POST", `/api/runs/${enc(id)}/resume`, body),
  predict: (spec, assumptions = null) => request("POST", "/api/predict",
    assumptions ? { spec, assumptions } : { spec }),
  files: (id) => request("GET", `/api/runs/${enc(id)}/files`),
  logStream: (id, rank) => new EventSource(`/api/runs/${enc(id)}/logs/stream` + qs({ rank })),
  liveStream: (id) => new EventSource(`/api/runs/${enc(id)}/live`),
  ganttSteps: (id) => request("GET", `/api/runs/${enc(id)}/gantt/steps`),
  gantt: (id, params = {}) => request("GET", `/api/runs/${enc(id)}/gantt` + qs(params)),
  collectiveSweeps: (ids) => request("GET", "/api/collective-sweeps" + qs({ ids: ids?.join(",") })),
  sweeps: (params = {}) => request("GET", "/api/sweeps" + qs(params)),
  sweep: (id) => request("GET", `/api/sweeps/${enc(id)}`),
  submitSweep: (body) => request("POST", "/api/sweeps", body),
  validateSweep: (body) => request("POST", "/api/sweep-checks", body),
  cancelSweep: (id) => request("POST", `/api/sweeps/${enc(id)}/cancel`),
  advise: (body) => request("POST", "/api/advise", body),
  schedules: () => request("GET", "/api/schedules"),
  exploreSchedule: (params) => request("GET", "/api/schedules/explore" + qs(params)),
  // The run's analysis (jobs.analysis: headline, rules, tables): every figure a page shows
  // comes from it. Fetched once per page; `fresh` asks again (a run still going). null: none yet.
  metrics(id, { fresh = false } = {}) {
    if (fresh || !metricsCache[id]) {
      metricsCache[id] = optional(request("GET", `/api/runs/${enc(id)}/metrics`));
    }
    return metricsCache[id];
  },
  exportUrl: (id, format, table) => `/api/runs/${enc(id)}/export` + qs({ format, table }),
  fileUrl: (id, path) => `/api/runs/${enc(id)}/files/${path.split("/").map(enc).join("/")}`,
};

export function formatErrors(detail) {
  if (Array.isArray(detail)) {
    return detail.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("\n");
  }
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}
