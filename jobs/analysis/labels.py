"""What a figure's name says about its unit, where the name alone did not.

`rate_unit`: tokens_per_s counts tokens for a language model and samples for the mlp (whose
"tokens" per step are its samples: steps.tokens_per_step); the headline carries it as
`throughput_unit` and the pages label by it (frontend units.js `rateUnit`, the one function
there). `csv_header`: a downloaded table names each column with its unit: a fraction (0-1)
without `_fraction` in its name gets it (`_pct` columns are percentages, 0-100), and an mlp's
`tokens` / `tokens_per_s` read `samples` / `samples_per_s`. The JSON keys stay as they are (the
API, the pages and the database columns read them). Standard library only.
"""

from __future__ import annotations

# columns holding a fraction (0-1) whose name does not say so, per table
FRACTIONS = {
    "stage_bubbles": ("inherent", "stall", "simulated", "closed_form", "predicted"),
    "expert_load": ("share",),
    "straggler_ranks": ("wait_share",),
    "headline": ("bubble_closed_form", "straggler_wait_share"),
}
SAMPLES = {"tokens": "samples", "tokens_per_s": "samples_per_s"}
SAMPLE_TABLES = ("throughput", "headline")  # where `tokens` are the step's (expert_load's
# are routed token assignments)


def rate_unit(spec: dict | None) -> str | None:
    """"tok/s" for a gpt, "samples/s" for any other train model, None for a benchmark."""
    if not spec or spec.get("kind", "train") != "train":
        return None
    return "tok/s" if (spec.get("model") or {}).get("arch") == "gpt" else "samples/s"


def csv_header(table: str, cols: list[str], unit: str | None) -> list[str]:
    """The CSV header of `table`'s columns `cols`; `unit`: the run's rate_unit (the
    headline's `throughput_unit`)."""
    frac = set(FRACTIONS.get(table, ()))
    out = []
    for c in cols:
        if c in frac:
            c = f"{c}_fraction"
        elif unit == "samples/s" and table in SAMPLE_TABLES:
            c = SAMPLES.get(c, c)
        out.append(c)
    return out
