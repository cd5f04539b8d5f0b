"""Client commands: they talk HTTP to PARALAB_URL (default http://127.0.0.1:8000): `submit`,
`runs`, `show`, `logs`, `cancel`, `predict`, `export`. Tables for people, `--json` for scripts.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from backend.cli._httpx import httpx
from jobs.units import fmt

FINISHED = ("succeeded", "failed", "cancelled", "timed_out", "hung")


class CliError(Exception):
    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


# -- HTTP client ----------------------------------------------------------------------------------

def _url() -> str:
    return os.environ.get("PARALAB_URL", "http://127.0.0.1:8000").rstrip("/")


@functools.cache
def _client(tls: bool) -> httpx.Client:
    return httpx.Client(verify=tls, limits=httpx.Limits(max_keepalive_connections=0))


def _http() -> httpx.Client:
    """The process's HTTP client (one for plain HTTP, one for HTTPS). httpx.request and
    httpx.stream build a Client per call, and with it a TLS context that loads the CA bundle
    (~20-30 ms, even for http://): `submit --wait` paid that three times. No keep-alive: each
    request has its own connection, as before, so nothing pooled outlives a server."""
    return _client(_url().startswith("https://"))


def _auth_headers(extra: dict | None = None) -> dict:
    """`Authorization: Bearer $PARALAB_TOKEN` when set (team mode; `paralab token create`)."""
    token = os.environ.get("PARALAB_TOKEN", "").strip()
    return {**(extra or {}), **({"Authorization": f"Bearer {token}"} if token else {})}


def _request(method: str, path: str, *, raw: bool = False, **kw):
    """The answer's JSON or text (`raw`: the httpx response itself); CliError on failure."""
    kw["headers"] = _auth_headers(kw.get("headers"))
    try:
        r = _http().request(method, _url() + path, timeout=kw.pop("timeout", 30), **kw)
    except httpx.TransportError as exc:
        raise CliError(f"cannot reach paralab at {_url()} ({exc}); is it running? "
                       "(`make run`, or set PARALAB_URL)", 3) from exc
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text
        if isinstance(detail, list):
            lines = [f"  {'.'.join(str(x) for x in e.get('loc', []))}: {e.get('msg')}"
                     for e in detail]
            raise CliError(f"rejected ({r.status_code}):\n" + "\n".join(lines))
        raise CliError(f"error {r.status_code}: {detail}")
    if raw:
        return r
    ctype = r.headers.get("content-type", "")
    return r.json() if "json" in ctype else r.text


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    cells = [[str(r.get(k) if r.get(k) is not None else "") for k, _ in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(cols)]
    out = ["  ".join(h.ljust(w) for (_, h), w in zip(cols, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


RUN_COLS = [("id", "ID"), ("name", "NAME"), ("strategy", "STRATEGY"), ("world_size", "WORLD"),
            ("status", "STATUS"), ("owner", "OWNER"), ("created_at", "CREATED")]


def _spec_body(a, what: str) -> dict:
    """SPEC.json ('-' = stdin) and/or --preset NAME -> the request body."""
    body: dict = {}
    if a.spec:
        try:
            text = sys.stdin.read() if a.spec == "-" else Path(a.spec).read_text()
            body = json.loads(text)
        except OSError as exc:
            raise CliError(f"{a.spec}: cannot read it ({exc.strerror})") from exc
        except ValueError as exc:
            raise CliError(f"{a.spec}: not valid JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise CliError(f"{a.spec}: must hold a JSON object ({what})")
    if a.preset:
        body = {"preset": a.preset, **body}
    if not body:
        raise CliError(f"give a {what} JSON file, or --preset NAME (see GET /api/presets)")
    return body


def cmd_submit(a) -> int:
    if getattr(a, "script", None):
        from backend.cli.scripts import script_body
        body = script_body(a, _spec_body(a, "job spec") if a.spec or a.preset else {})
    else:
        body = _spec_body(a, "job spec")
    if a.name:
        body["name"] = a.name
    run = _request("POST", "/api/runs", json=body)
    if a.wait:
        run = _wait(run)
    if a.json:
        print(json.dumps(run, indent=1))
    else:
        print(f"{run['id']}  {run['strategy']}  {run['status']}")
        if run.get("error"):
            print(run["error"], file=sys.stderr)
    return 0 if not a.wait or run["status"] == "succeeded" else 1


def _wait(run: dict) -> dict:
    """Until the run has finished: woken by its event stream's `end` (GET /live), not a
    poll; a dropped stream (the server restarted) is reopened after a pause."""
    while run["status"] not in FINISHED:
        try:
            for event, _data, _id in _sse(f"/api/runs/{run['id']}/live"):
                if event == "end":
                    break
        except httpx.TransportError:
            time.sleep(1)
        run = _request("GET", f"/api/runs/{run['id']}")
    return run


def _sse(path: str, params: dict | None = None, headers: dict | None = None):
    """(event, data, id) of a server-sent-event stream as each arrives (`: ping` comments
    skipped); CliError on an error answer, httpx.TransportError when the connection drops."""
    with _http().stream("GET", f"{_url()}{path}", params=params or {},
                        headers=_auth_headers(headers or {}), timeout=None) as r:
        if r.status_code >= 400:
            raise CliError(f"error {r.status_code}: {r.read().decode()}")
        event, data, last = "message", [], None
        for line in r.iter_lines():
            if line.startswith("id:"):
                last = line[3:].strip()
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line:
                if data or event != "message":
                    yield event, "\n".join(data), last
                event, data = "message", []


def cmd_checkpoints(a) -> int:
    rows = _request("GET", f"/api/runs/{a.id}/checkpoints")
    if a.json:
        print(json.dumps(rows, indent=1))
    elif not rows:
        print(f"run {a.id} has no complete checkpoint")
    else:
        print(_table(rows, [("step", "STEP"), ("strategy", "STRATEGY"),
                            ("world_size", "WORLD"), ("dp", "DP"), ("tp", "TP"), ("pp", "PP")]))
    return 0


def cmd_resume(a) -> int:
    body: dict = {}
    if a.overrides:
        a.spec, a.preset = a.overrides, None
        body = _spec_body(a, "spec overrides")
    if a.step is not None:
        body["step"] = a.step
    if a.name:
        body["name"] = a.name
    run = _request("POST", f"/api/runs/{a.id}/resume", json=body)
    if a.wait:
        run = _wait(run)
    if a.json:
        print(json.dumps(run, indent=1))
    else:
        print(f"{run['id']}  {run['strategy']}  {run['status']}  (resumes {a.id} at step "
              f"{run['spec']['resume']['step']})")
        if run.get("error"):
            print(run["error"], file=sys.stderr)
    return 0 if not a.wait or run["status"] == "succeeded" else 1


def cmd_runs(a) -> int:
    params = {k: v for k, v in {"status": a.status, "strategy": a.strategy, "owner": a.owner,
                                "tag": a.tag, "q": a.q, "limit": a.limit,
                                "sort": a.sort}.items() if v}
    page = _request("GET", "/api/runs", params=params)
    print(json.dumps(page, indent=1) if a.json else _table(page["items"], RUN_COLS))
    return 0


def cmd_show(a) -> int:
    run = _request("GET", f"/api/runs/{a.id}")
    if a.json:
        print(json.dumps(run, indent=1))
        return 0
    for key in ("id", "name", "strategy", "status", "owner", "world_size", "queue",
                "worker_host", "created_at", "started_at", "finished_at", "exit_code"):
        print(f"{key:>12}: {run.get(key) if run.get(key) is not None else ''}")
    print(f"{'tags':>12}: {', '.join(run['tags'])}")
    if run.get("error"):
        print(f"{'error':>12}: {run['error']}")
    for key, unit, label in SHOW_FIGURES:  # the history's figure columns (models.METRIC_COLUMNS)
        if run.get(key) is not None:
            v = run[key] * (100 if key == "bubble_fraction" else 1)
            print(f"{label:>12}: {fmt(v, unit)}")
    summary = run.get("summary") or {}
    if summary.get("loss"):
        print(f"{'loss':>12}: {' '.join(f'{x:.4f}' for x in summary['loss'])}")
    print(f"{'page':>12}: {_url()}/runs/{run['id']}")
    return 0


SHOW_FIGURES = (("step_time_s", "s", "step time"), ("tokens_per_s", "tok/s", "throughput"),
                ("peak_memory_bytes", "B", "peak memory"),
                ("exposed_comm_s", "s", "exposed comm"), ("bubble_fraction", "%", "bubble"),
                ("overlap_pct", "%", "overlap"), ("final_loss", "", "final loss"),
                ("duration_s", "s", "duration"))


LOG_PAGE = 10_000  # lines per request of `paralab logs` (the API's default)


def cmd_logs(a) -> int:
    params = {"rank": a.rank} if a.rank is not None else {}
    if not a.follow:  # page by page (X-Next-After), each written as it comes
        after = -1
        while True:
            r = _request("GET", f"/api/runs/{a.id}/logs", raw=True,
                         params={**params, "after": after, "limit": LOG_PAGE})
            sys.stdout.write(r.text)
            if "link" not in r.headers:  # no rel="next": the end of the log
                return 0
            after = int(r.headers["x-next-after"])
    last = None
    while True:  # reconnects resume after the last line seen (Last-Event-ID)
        try:
            for event, data, seq in _sse(f"/api/runs/{a.id}/logs/stream", params,
                                         {"Last-Event-ID": last} if last else {}):
                last = seq or last
                if event == "message":
                    print(data, flush=True)
                elif event == "end":
                    return 0
        except httpx.TransportError:
            time.sleep(1)


def cmd_cancel(a) -> int:
    run = _request("POST", f"/api/runs/{a.id}/cancel")
    print(json.dumps(run, indent=1) if a.json else f"{run['id']}  {run['status']}"
          + ("  (cancel requested)" if run["cancel_requested"] and run["status"] == "running"
             else ""))
    return 0


def cmd_predict(a) -> int:
    body = _spec_body(a, "job spec or what-if")
    out = _request("POST", "/api/predict", json=body)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    mem, comm, pipe = out.get("memory") or {}, out.get("comm") or {}, out.get("pipeline") or {}
    print(f"memory model : {mem.get('memory_model')}")
    print(f"per rank     : {fmt(mem.get('per_rank_bytes'), 'B')}  ("
          + ", ".join(f"{k} {fmt(v, 'B')}" for k, v in (mem.get("components") or {}).items())
          + ")")
    if comm:
        print(f"comm / rank  : {fmt(comm.get('bytes_per_rank'), 'B')} per step "
              f"({comm.get('convention')})")
    if pipe:
        bubble = pipe.get("bubble_fraction")
        print(f"bubble       : {fmt(None if bubble is None else 100 * bubble, '%')} "
              f"({pipe.get('convention')})")
    return 0


def cmd_export(a) -> int:
    """Stream one export to a file (a run's traces can be large: never held in memory)."""
    rank, step = getattr(a, "rank", None), getattr(a, "step", None)
    params = {"format": a.format, **({"table": a.table} if a.table else {}),
              **({"rank": rank} if rank is not None else {}),
              **({"step": step} if step is not None else {})}
    default = {"perfetto": f"{a.id}.perfetto.json", "json": f"{a.id}.analysis.json",
               "csv": f"{a.id}.{a.table or 'tables'}.csv",
               "kineto": f"{a.id}.kineto.zip" if rank is None
               else f"{a.id}.rank{rank}.pt.trace.json",
               "flight": f"{a.id}.flight.zip",
               "checkpoint": f"{a.id}.checkpoint.zip"}[a.format]
    out = Path(a.output or default)
    try:
        with _http().stream("GET", f"{_url()}/api/runs/{a.id}/export", params=params,
                            timeout=120, headers=_auth_headers()) as r:
            if r.status_code >= 400:
                raise CliError(f"error {r.status_code}: {r.read().decode(errors='replace')[:500]}")
            size = 0
            tmp = out.with_name(out.name + ".part")
            with open(tmp, "wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
                    size += len(chunk)
            tmp.replace(out)
    except httpx.TransportError as exc:
        raise CliError(f"cannot reach paralab at {_url()} ({exc})", 3) from exc
    print(f"wrote {out} ({size} bytes)")
    return 0
