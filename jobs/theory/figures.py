"""One figure of the theory's output: value, unit, formula, inputs and convention together."""

from __future__ import annotations

GB = 1e9


def fig(value, unit: str, formula: str, inputs: dict, convention: str) -> dict:
    return {"value": value, "unit": unit, "formula": formula, "inputs": inputs,
            "convention": convention}
