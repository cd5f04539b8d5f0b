// Human-readable numbers: the rule of jobs/units.py (the CLI's), in JavaScript. Auto-scaled SI
// prefixes (powers of 1000; bytes decimal: kB, MB, GB), 3 significant digits, "–" for a missing
// or non-finite value; times of 1000 s and more in minutes, then hours. Both implementations
// answer tests/data/units_snapshot.json identically (tests/frontend/test_units.py).
// Chart axes use `axisUnit` (linear: scale the data into one unit, so ticks read "2.5 GB", never
// "2500 MB" or "10k MB") and `logAxis` (log: one labelled tick per decade, no minor digits).

export const DASH = "–";
const UP = ["", "k", "M", "G", "T", "P", "E"];
const DOWN = ["", "m", "µ", "n", "p"];
const SUBUNIT = new Set(["s"]); // units scaled below 1 with m / µ / n (no millibytes)

function roundSig(x, sig) {
  return x === 0 ? 0 : Number(x.toPrecision(sig));
}

function digits(x, sig, trim) {
  if (x === 0) return "0";
  const decimals = Math.max(0, sig - 1 - Math.floor(Math.log10(Math.abs(x))));
  let text = x.toFixed(decimals);
  if (trim && text.includes(".")) text = text.replace(/0+$/, "").replace(/\.$/, "");
  return text;
}

function scaled(v, sig, allowDown) {
  const r = roundSig(v, sig);
  if (r === 0) return [0, ""];
  let e = Math.floor(Math.log10(Math.abs(r)) / 3);
  if (e < 0 && !allowDown) e = 0;
  e = Math.max(-(DOWN.length - 1), Math.min(UP.length - 1, e));
  let m = roundSig(r / 1000 ** e, sig);
  if (Math.abs(m) >= 1000 && e + 1 < UP.length) { // 999.96 k rounds to 1000 k: say 1.00 M
    e += 1;
    m = roundSig(r / 1000 ** e, sig);
  }
  return [m, e >= 0 ? UP[e] : DOWN[-e]];
}

// `value` in `unit`: "B", "s", "B/s", "%" (value already in percent), "" or a count unit
export function fmt(value, unit = "", { sig = 3, trim = false } = {}) {
  if (value === null || value === undefined || typeof value === "boolean") return DASH;
  const v = Number(value);
  if (!Number.isFinite(v)) return DASH;
  const sep = unit ? " " : "";
  if (unit === "%") return `${digits(roundSig(v, sig), sig, trim)} %`;
  if (unit === "s" && Math.abs(roundSig(v, sig)) >= 1000) {
    const [div, name] = Math.abs(roundSig(v, sig)) >= 60000 ? [3600, "h"] : [60, "min"];
    return `${digits(roundSig(v / div, sig), sig, trim)} ${name}`;
  }
  if (!SUBUNIT.has(unit) && Number.isInteger(v) && Math.abs(v) < 1000) return `${v}${sep}${unit}`;
  const [m, prefix] = scaled(v, sig, SUBUNIT.has(unit));
  return `${digits(m, sig, trim)}${sep}${prefix}${unit}`;
}

export const fmtBytes = (b) => fmt(b, "B");
export const fmtTime = (s) => fmt(s, "s");
export const fmtRate = (v, unit = "B/s") => fmt(v, unit);
// a fraction (0.25) or a percentage (25) as "25.0 %"
export const fmtPct = (x, isFraction = false) =>
  (x === null || x === undefined ? DASH : fmt(isFraction ? x * 100 : x, "%"));

// What a run's throughput counts per second, by model kind: "tok/s" for a language model,
// "samples/s" for the mlp (its "tokens" per step are samples). `src`: an analysis headline or
// a run's metrics (their `throughput_unit`, jobs/analysis/labels.py rate_unit, the one rule the
// CSV headers follow too), a spec (model.arch) or an arch name. Unknown: "tok/s", the word
// analyses before issue 37 used.
export function rateUnit(src) {
  if (typeof src === "string") return src === "gpt" ? "tok/s" : "samples/s";
  if (src?.throughput_unit) return src.throughput_unit;
  if (src?.model?.arch) return rateUnit(src.model.arch);
  return "tok/s";
}
// a throughput in its unit, scaled like every other figure (3.88 ktok/s, never "3,875 tok/s")
export const fmtThroughput = (v, src) => fmt(v, rateUnit(src));

// Linear axis: the one unit the data is drawn in. {div, unit, title(label)}: plot value / div.
export function axisUnit(values, unit) {
  const finite = values.map(Number).filter(Number.isFinite);
  const max = finite.length ? Math.max(...finite.map(Math.abs)) : 0;
  let div = 1;
  let name = unit;
  if (unit === "s" && max >= 1000) {
    [div, name] = max >= 60000 ? [3600, "h"] : [60, "min"];
  } else if (max > 0 && unit !== "%") {
    let e = Math.floor(Math.log10(max) / 3);
    if (e < 0 && !SUBUNIT.has(unit)) e = 0;
    e = Math.max(-(DOWN.length - 1), Math.min(UP.length - 1, e));
    div = 1000 ** e;
    name = `${e >= 0 ? UP[e] : DOWN[-e]}${unit}`;
  }
  return { div, unit: name, title: (label) => (name ? `${label} (${name})` : label) };
}

// Log axis over [lo, hi] (positive): a tick per decade (every 2nd / 3rd when there are many),
// labelled by `fmt` without trailing zeros; Plotly draws no other tick label.
export function logAxis(lo, hi, unit) {
  if (!(lo > 0) || !(hi > 0)) return { type: "log" };
  const a = Math.floor(Math.log10(Math.min(lo, hi)) + 1e-9);
  const b = Math.ceil(Math.log10(Math.max(lo, hi)) - 1e-9);
  const every = Math.max(1, Math.ceil((b - a + 1) / 8));
  const tickvals = [];
  for (let k = a; k <= b; k += every) tickvals.push(Number(`1e${k}`));
  return { type: "log", tickmode: "array", tickvals,
    ticktext: tickvals.map((v) => fmt(v, unit, { trim: true })), minor: { showgrid: false } };
}

// "512MB", "1.5 GB", "2e9" -> a number in `unit` (SI prefixes, as fmt writes them); NaN when the
// text is not a quantity of that unit.
export function parseQuantity(text, unit = "B") {
  const m = String(text).trim().match(/^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kMGTP]?)\s*(\S*)$/i);
  if (!m || (m[3] && m[3] !== unit)) return NaN;
  const prefix = m[2].toLowerCase() === "k" ? "k" : m[2].toUpperCase(); // "mb" means MB here
  return Number(m[1]) * 1000 ** (prefix ? "kMGTP".indexOf(prefix) + 1 : 0);
}
