// Reading the run's analysis (GET /api/runs/{id}/metrics, computed by jobs.analysis): tables by
// name, the rule wording that goes next to a figure, and the steps an aggregate covers. The
// page computes no figure of its own.

export const table = (analysis, name) => analysis?.tables?.[name] || [];

export const headlineOf = (analysis) => analysis?.headline || {};

// "steps 1–4" for the steady steps an aggregate covers (rules: step 0 is warm-up)
export function stepsLabel(h) {
  const s = h?.steady_steps;
  if (!Array.isArray(s)) return "no complete step";
  return s[0] === s[1] ? `step ${s[0]}` : `steps ${s[0]}–${s[1]}`;
}

export const rule = (analysis, key) => analysis?.rules?.[key] || "";
