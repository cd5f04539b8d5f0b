// Every request the front end makes goes through this module.
async function request(method, path, body) {
  const opts = { method, headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const data = r.headers.get("content-type")?.includes("json") ? await r.json() : await r.text();
  if (!r.ok) {
    const err = new Error(`HTTP ${r.status}`);
    err.status = r.status;
    err.detail = data && data.detail !== undefined ? data.detail : data;
    throw err;
  }
  return data;
}

export const api = {
  presets: () => request("GET", "/api/presets"),
  runs: (params = {}) => request("GET", "/api/runs?" + new URLSearchParams(params)),
  run: (id) => request("GET", `/api/runs/${encodeURIComponent(id)}`),
  submit: (spec) => request("POST", "/api/runs", spec),
  cancel: (id) => request("POST", `/api/runs/${encodeURIComponent(id)}/cancel`),
  logStream: (id) => new EventSource(`/api/runs/${encodeURIComponent(id)}/logs/stream`),
};

export function formatErrors(detail) {
  if (Array.isArray(detail)) {
    return detail.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("\n");
  }
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}
