"""A sweep submission's body: its rules, and the expansion of a grid or an explicit member list
into each member's overrides and merged spec body (docs/sweeps.md). Pure: no database.

Grid rule: each key is a dotted spec path (`parallel.zero_stage`); the key "." (or "") is the
spec's root. Each value is a non-empty list; an item that is an object is deep-merged at that
path (jobs.spec.deep_merge), anything else replaces the field. The members are the cartesian
product of the axes, in the keys' order, the last axis varying fastest; each member's overrides
are its axes' values deep-merged in key order. So one axis can change several fields together:
`".": [{"parallel": {"dp": 2}, "runtime": {"nproc_per_node": 2}}, ...]`.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from backend.api.schemas import json_problems
from backend.errors import Invalid
from jobs.spec import deep_merge, text_problem

MAX_MEMBERS = 256
FIELDS = ("name", "base", "grid", "members", "queue", "cluster", "tags", "notes")
# `cluster`: the advisor's link bandwidths and compute rate, so each member's prediction is
# the advisor's breakdown (compute, bubble, comm, step) the sweep page re-states as measured
CLUSTER_FIELDS = {"intra_GBps": True, "inter_GBps": True, "flops": False}
ROOT = (".", "")


def _err(loc: list, msg: str, typ: str = "value_error") -> dict:
    return {"loc": ["body", *loc], "msg": msg, "type": typ}


def _at(path: str, value: Any) -> dict:
    """{"a": {"b": value}} for the path "a.b"; the root's value itself (an object)."""
    if path in ROOT:
        return value
    for part in reversed(path.split(".")):
        value = {part: value}
    return value


def _grid_errors(grid: Any) -> list[dict]:
    if not isinstance(grid, dict) or not grid:
        return [_err(["grid"], "grid: must be a non-empty object {dotted spec path: [values]}")]
    errors = []
    for key, values in grid.items():
        if problem := text_problem(key):
            errors.append(_err(["grid", key], f"grid key: {problem}", "string_unsafe"))
        elif key not in ROOT and (any(not p for p in key.split(".")) or len(key) > 200):
            errors.append(_err(["grid", key], "grid key: must be a dotted spec path such as "
                               "parallel.zero_stage (no empty part), or \".\" for the root"))
        elif not isinstance(values, list) or not values:
            errors.append(_err(["grid", key], "grid value: must be a non-empty list of values"))
        elif key in ROOT and not all(isinstance(v, dict) for v in values):
            errors.append(_err(["grid", key], "grid root axis: every value must be an object, "
                               "deep-merged into the spec's root"))
    if not errors and (n := math.prod(len(v) for v in grid.values())) > MAX_MEMBERS:
        errors.append(_err(["grid"], f"grid: expands to {n} members; at most {MAX_MEMBERS}",
                           "too_many_members"))
    return errors


def _members_errors(members: Any) -> list[dict]:
    if not isinstance(members, list) or not members:
        return [_err(["members"], "members: must be a non-empty list of override objects")]
    if len(members) > MAX_MEMBERS:
        return [_err(["members"], f"members: {len(members)} members; at most {MAX_MEMBERS}",
                     "too_many_members")]
    return [_err(["members", i], "members: each member must be an object of overrides")
            for i, m in enumerate(members) if not isinstance(m, dict)]


def _cluster_errors(cluster: Any) -> list[dict]:
    if cluster is None:
        return []
    if not isinstance(cluster, dict):
        return [_err(["cluster"], "cluster: must be an object {intra_GBps, inter_GBps, flops}")]
    errors = [_err(["cluster", k], f"cluster.{k}: unknown field; allowed: "
                   f"{', '.join(CLUSTER_FIELDS)}", "extra_forbidden")
              for k in cluster if k not in CLUSTER_FIELDS]
    for k, required in CLUSTER_FIELDS.items():
        v = cluster.get(k)
        if v is None:
            if required:
                errors.append(_err(["cluster", k], f"cluster.{k}: field required", "missing"))
        elif isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
            errors.append(_err(["cluster", k], f"cluster.{k}: must be a positive finite number"))
    return errors


def parse(body: Any) -> tuple[str, dict, dict | None, list[dict], str | None]:
    """(name, base, grid or None, each member's overrides, queue or None). Invalid (422) naming
    the field when the body breaks a rule. Tags and notes are runs._meta's."""
    if not isinstance(body, dict):
        raise Invalid(errors=[_err([], "body: must be a JSON object")])
    errors = [_err([k], f"{k}: unknown field; allowed: {', '.join(FIELDS)}", "extra_forbidden")
              for k in body if k not in FIELDS]
    name = body.get("name", "sweep")
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 200:
        errors.append(_err(["name"], "name: must be a string of 1-200 characters"))
    elif problem := text_problem(name):
        errors.append(_err(["name"], f"name: {problem}", "string_unsafe"))
    base = body.get("base")
    if not isinstance(base, dict):
        errors.append(_err(["base"], "base: required, a spec object or {\"preset\": NAME, "
                           "...overrides}"))
    queue = body.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue or text_problem(queue)):
        errors.append(_err(["queue"], "queue: must be a non-empty string (a worker queue)"))
    errors += _cluster_errors(body.get("cluster"))
    has_grid, has_members = "grid" in body, "members" in body
    if has_grid == has_members:
        errors.append(_err(["grid" if has_grid else "members"], "grid, members: give exactly "
                           f"one of them (got {'both' if has_grid else 'neither'})"))
    elif has_grid:
        errors += _grid_errors(body["grid"])
    else:
        errors += _members_errors(body["members"])
    # what is stored as it came (base, grid, members: the sweep's own record, and each
    # invalid member's overrides) must hold on both databases: text without NUL or lone
    # surrogates, finite numbers (the members' spec rules come later, per member)
    for part in ("base", "grid", "members"):
        if isinstance(body.get(part), dict | list):
            errors += [_err([part, *loc], f"{part}: {rule}", "value_error")
                       for loc, rule in json_problems(body[part])]
    if errors:
        raise Invalid(errors=errors)
    if has_grid:
        axes = [[_at(k, v) for v in values] for k, values in body["grid"].items()]
        overrides = [_merge_all(combo) for combo in itertools.product(*axes)]
    else:
        overrides = list(body["members"])
    return name.strip(), base, body["grid"] if has_grid else None, overrides, queue


def _merge_all(parts: tuple[dict, ...]) -> dict:
    out: dict = {}
    for p in parts:
        out = deep_merge(out, p)
    return out


def _flat(d: dict) -> list[str]:
    """`key=value` for each leaf of the overrides (leaf names: short enough for a run name)."""
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flat(v)
        else:
            out.append(f"{k}={v}")
    return out


def member_body(name: str, base: dict, overrides: dict, queue: str | None) -> dict:
    """The spec body a member is validated and launched with: the overrides deep-merged into
    the base; its name, unless the overrides give one, the sweep's with the overrides' leaf
    values (so the history tells the members apart); the sweep's queue, if it has one."""
    body = deep_merge(base, overrides)
    if "name" not in overrides:
        label = ", ".join(_flat(overrides))
        body["name"] = f"{name} [{label}]"[:200] if label else name
    if queue is not None:
        body["runtime"] = {**(body.get("runtime") if isinstance(body.get("runtime"), dict)
                              else {}), "queue": queue}
    return body
