"""`paralab sweep submit FILE | show ID | list | cancel ID`: sweeps over HTTP (docs/sweeps.md).
The member table shows the key figures as `paralab show` does (SHOW_FIGURES, jobs.units)."""

from __future__ import annotations

import json
import time

from backend.cli.client import SHOW_FIGURES, CliError, _request, _spec_body, _table, _url
from jobs.units import fmt

ACTIVE = ("queued", "running")
_FIGS = {k: (unit, label) for k, unit, label in SHOW_FIGURES}
MEMBER_FIGURES = ("step_time_s", "tokens_per_s", "peak_memory_bytes", "exposed_comm_s",
                  "bubble_fraction")


def add_parser(sub) -> None:
    s = sub.add_parser("sweep", help="a group of runs from one submission (docs/sweeps.md)")
    ss = s.add_subparsers(dest="sweep_cmd", required=True)
    t = ss.add_parser("submit", help="submit SWEEP.json: {name, base, grid | members, ...}")
    t.add_argument("spec", help="sweep JSON file ('-' for stdin)")
    t.add_argument("--name")
    t.add_argument("--force", action="store_true", help="skip the memory gate")
    t.add_argument("--wait", action="store_true", help="wait until no member is active")
    t = ss.add_parser("show", help="one sweep and its members")
    t.add_argument("id")
    t = ss.add_parser("list", help="list sweeps")
    for flag in ("--status", "--owner", "--tag", "--q"):
        t.add_argument(flag)
    t.add_argument("--limit", type=int, default=50)
    t = ss.add_parser("cancel", help="cancel every queued and running member")
    t.add_argument("id")
    for t in ss.choices.values():
        t.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_sweep)


def _figure(key: str, v) -> str:
    if v is None:
        return ""
    unit = _FIGS[key][0]
    return fmt(v * (100 if key == "bubble_fraction" else 1), unit)


def _members(s: dict) -> str:
    rows = []
    for m in s["members"]:
        measured = (m.get("run") or {}).get("measured") or {}
        over = ", ".join(f"{k}={json.dumps(v)}" for k, v in _leaves(m["overrides"]).items())
        why = "; ".join(f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}"
                        for e in m["errors"] or [])
        rows.append({"index": m["index"], "status": m["status"], "run_id": m["run_id"] or "",
                     "overrides": over or "(base)",
                     **{k: _figure(k, measured.get(k)) for k in MEMBER_FIGURES}, "why": why})
    cols = [("index", "#"), ("status", "STATUS"), ("run_id", "RUN"), ("overrides", "OVERRIDES"),
            *((k, _FIGS[k][1].upper()) for k in MEMBER_FIGURES), ("why", "NOT LAUNCHED")]
    return _table(rows, cols)


def _leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        out.update(_leaves(v, path) if isinstance(v, dict) else {path: v})
    return out


def _print(s: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(s, indent=1))
        return
    counts = ", ".join(f"{n} {k}" for k, n in s["counts"].items() if k != "total")
    print(f"{s['id']}  {s['name']}  {s['status']}  ({s['counts']['total']} members: {counts})")
    if s.get("members") is not None:
        print(_members(s))
        print(f"page: {_url()}/sweeps/{s['id']}")


def cmd_sweep(a) -> int:
    if a.sweep_cmd == "submit":
        a.preset = None
        body = _spec_body(a, "sweep")
        if a.name:
            body["name"] = a.name
        s = _request("POST", "/api/sweeps", json=body,
                     params={"force": "true"} if a.force else None)
        while a.wait and s["status"] in ACTIVE:
            time.sleep(2)
            s = _request("GET", f"/api/sweeps/{s['id']}")
        _print(s, a.json)
        return 0 if not a.wait or s["status"] == "succeeded" else 1
    if a.sweep_cmd == "show":
        _print(_request("GET", f"/api/sweeps/{a.id}"), a.json)
        return 0
    if a.sweep_cmd == "cancel":
        _print(_request("POST", f"/api/sweeps/{a.id}/cancel"), a.json)
        return 0
    if a.sweep_cmd == "list":
        params = {k: v for k, v in {"status": a.status, "owner": a.owner, "tag": a.tag,
                                    "q": a.q, "limit": a.limit}.items() if v}
        page = _request("GET", "/api/sweeps", params=params)
        if a.json:
            print(json.dumps(page, indent=1))
        else:
            rows = [{**s, "members": s["counts"]["total"]} for s in page["items"]]
            print(_table(rows, [("id", "ID"), ("name", "NAME"), ("status", "STATUS"),
                                ("members", "MEMBERS"), ("owner", "OWNER"),
                                ("created_at", "CREATED")]))
        return 0
    raise CliError(f"unknown sweep command {a.sweep_cmd!r}")
