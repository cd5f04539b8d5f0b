"""Human-readable numbers: one rule for bytes, times, rates, counts and percentages, used by the
CLI (`paralab predict`, `show`) and, through `frontend/static/js/units.js` (the same rule in
JavaScript, held to the same answers by tests/data/units_snapshot.json), by every chart axis,
card and table of the dashboard.

    fmt(3.2e9, "B")      -> "3.20 GB"     fmt(1.5e-5, "s")  -> "15.0 µs"
    fmt(12.34, "%")      -> "12.3 %"      fmt(2.5e4, "tok/s") -> "25.0 ktok/s"

Auto-scaled SI prefixes (powers of 1000; bytes are decimal: kB, MB, GB), 3 significant digits
(`trim=True` drops trailing zeros, for axis labels), "–" for a missing or non-finite value.
Times of 1000 s and more read in minutes, then hours. Standard library only.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

DASH = "–"
_UP = ["", "k", "M", "G", "T", "P", "E"]
_DOWN = ["", "m", "µ", "n", "p"]
# units whose values may be scaled below 1 with m / µ / n (a millibyte is not a thing)
_SUBUNIT = {"s"}
_BYTES = {"B", "B/s"}


def _round_sig(x: float, sig: int) -> float:
    """x rounded to `sig` significant digits, halves away from zero on the exact binary value
    (what JavaScript's toPrecision does, so both implementations agree on every input)."""
    if x == 0:
        return 0.0
    step = Decimal(1).scaleb(math.floor(math.log10(abs(x))) - sig + 1)
    return float(Decimal(x).quantize(step, rounding=ROUND_HALF_UP))


def _digits(x: float, sig: int, trim: bool) -> str:
    """x (already rounded to `sig` significant digits) with exactly `sig` significant digits."""
    if x == 0:
        return "0"
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    text = str(Decimal(x).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _scaled(v: float, sig: int, allow_down: bool) -> tuple[float, str]:
    """(mantissa, prefix) with 1 <= |mantissa| < 1000 where the prefixes allow."""
    r = _round_sig(v, sig)
    if r == 0:
        return 0.0, ""
    e = math.floor(math.log10(abs(r)) / 3)
    if e < 0 and not allow_down:
        e = 0
    e = max(-(len(_DOWN) - 1), min(len(_UP) - 1, e))
    m = _round_sig(r / 1000.0 ** e, sig)
    if abs(m) >= 1000 and e + 1 < len(_UP):  # 999.96 k rounds to 1000 k: say 1.00 M
        e += 1
        m = _round_sig(r / 1000.0 ** e, sig)
    return m, (_UP[e] if e >= 0 else _DOWN[-e])


def fmt(value, unit: str = "", *, sig: int = 3, trim: bool = False) -> str:
    """`value` in `unit` ("B", "s", "B/s", "%", "" or any count unit such as "tok/s")."""
    if value is None or isinstance(value, bool):
        return DASH
    try:
        v = float(value)
    except (TypeError, ValueError):
        return DASH
    if not math.isfinite(v):
        return DASH
    sep = " " if unit else ""
    if unit == "%":
        return f"{_digits(_round_sig(v, sig), sig, trim)} %"
    if unit == "s" and abs(_round_sig(v, sig)) >= 1000:
        div, name = (3600.0, "h") if abs(_round_sig(v, sig)) >= 60000 else (60.0, "min")
        return f"{_digits(_round_sig(v / div, sig), sig, trim)} {name}"
    if unit not in _SUBUNIT and v.is_integer() and abs(v) < 1000:
        return f"{int(v)}{sep}{unit}"  # bytes and counts below 1000 are whole numbers
    m, prefix = _scaled(v, sig, unit in _SUBUNIT)
    return f"{_digits(m, sig, trim)}{sep}{prefix}{unit}"
