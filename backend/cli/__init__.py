"""`paralab` command line.

Service commands: `up` (migrations + API + worker, what `make run` starts), `serve`, `worker`,
`migrate`. Client commands talk HTTP to PARALAB_URL (default http://127.0.0.1:8000): `submit`,
`runs`, `show`, `logs`, `cancel`, `predict`, `export`. Tables for people, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

FINISHED = ("succeeded", "failed", "cancelled", "timed_out")


class CliError(Exception):
    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


# -- HTTP client ----------------------------------------------------------------------------------

def _url() -> str:
    return os.environ.get("PARALAB_URL", "http://127.0.0.1:8000").rstrip("/")


def _auth_headers(extra: dict | None = None) -> dict:
    """`Authorization: Bearer $PARALAB_TOKEN` when set (team mode; `paralab token create`)."""
    token = os.environ.get("PARALAB_TOKEN", "").strip()
    return {**(extra or {}), **({"Authorization": f"Bearer {token}"} if token else {})}


def _request(method: str, path: str, **kw):
    kw["headers"] = _auth_headers(kw.get("headers"))
    try:
        r = httpx.request(method, _url() + path, timeout=kw.pop("timeout", 30), **kw)
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
    body = _spec_body(a, "job spec")
    if a.name:
        body["name"] = a.name
    run = _request("POST", "/api/runs", json=body)
    if a.wait:
        while run["status"] not in FINISHED:
            time.sleep(1)
            run = _request("GET", f"/api/runs/{run['id']}")
    if a.json:
        print(json.dumps(run, indent=1))
    else:
        print(f"{run['id']}  {run['strategy']}  {run['status']}")
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
    summary = run.get("summary") or {}
    if summary.get("loss"):
        print(f"{'loss':>12}: {' '.join(f'{x:.4f}' for x in summary['loss'])}")
    return 0


def cmd_logs(a) -> int:
    params = {"rank": a.rank} if a.rank is not None else {}
    if not a.follow:
        sys.stdout.write(_request("GET", f"/api/runs/{a.id}/logs", params=params))
        return 0
    last = None
    while True:  # reconnects resume after the last line seen (Last-Event-ID)
        headers = {"Last-Event-ID": last} if last else {}
        try:
            with httpx.stream("GET", f"{_url()}/api/runs/{a.id}/logs/stream", params=params,
                              headers=_auth_headers(headers), timeout=None) as r:
                if r.status_code >= 400:
                    raise CliError(f"error {r.status_code}: {r.read().decode()}")
                event, data = "message", []
                for line in r.iter_lines():
                    if line.startswith("id:"):
                        last = line[3:].strip()
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                    elif not line:
                        if event == "message":
                            print("\n".join(data), flush=True)
                        elif event == "end":
                            return 0
                        event, data = "message", []
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
    gb = 1e9
    print(f"memory model : {mem.get('memory_model')}")
    print(f"per rank     : {mem.get('per_rank_bytes', 0) / gb:.3f} GB  "
          + "  ".join(f"{k} {v / gb:.3f}" for k, v in (mem.get("components") or {}).items()))
    if comm:
        print(f"comm / rank  : {comm.get('bytes_per_rank', 0) / gb:.3f} GB per step "
              f"({comm.get('convention')})")
    if pipe:
        print(f"bubble       : {pipe.get('bubble_fraction')} ({pipe.get('convention')})")
    return 0


def cmd_export(a) -> int:
    params = {"format": a.format, **({"table": a.table} if a.table else {})}
    try:
        r = httpx.get(f"{_url()}/api/runs/{a.id}/export", params=params, timeout=120,
                      headers=_auth_headers())
    except httpx.TransportError as exc:
        raise CliError(f"cannot reach paralab at {_url()} ({exc})", 3) from exc
    if r.status_code >= 400:
        raise CliError(f"error {r.status_code}: {r.text[:500]}")
    default = {"perfetto": f"{a.id}.perfetto.json", "json": f"{a.id}.analysis.json",
               "csv": f"{a.id}.{a.table or 'tables'}.csv"}[a.format]
    out = Path(a.output or default)
    out.write_bytes(r.content)
    print(f"wrote {out} ({len(r.content)} bytes)")
    return 0


# -- service commands -----------------------------------------------------------------------------

def cmd_migrate(a) -> int:
    from backend.core.config import get_settings
    from backend.migrate import upgrade
    upgrade(get_settings().db_url)
    return 0


def cmd_serve(a) -> int:
    import uvicorn

    from backend.core.config import get_settings
    from backend.core.security import ConfigError, check_startup
    from backend.main import create_app
    settings = get_settings()
    host = a.host or settings.host
    try:
        check_startup(settings, host)  # secret key in team mode; loopback only in local mode
        app = create_app(settings)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    uvicorn.run(app, host=host, port=a.port or settings.port,
                log_level="info", timeout_graceful_shutdown=5)
    return 0


def cmd_worker(a) -> int:
    if a.queue:
        os.environ["PARALAB_QUEUE"] = a.queue
    if a.slots:
        os.environ["PARALAB_WORKER_SLOTS"] = str(a.slots)
    from backend.core.config import get_settings
    from worker.app import get_celery
    from worker.tasks import worker_name
    settings = get_settings()
    app = get_celery(settings)
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(settings.worker_slots),
                     "--queues", settings.queue, "--hostname", worker_name(settings),
                     "--loglevel", "INFO", "--without-gossip", "--without-mingle"])
    return 0


def cmd_users(a) -> int:
    from backend.cli.users import cli_users
    from backend.errors import DomainError
    try:
        return cli_users(a)
    except (ValueError, DomainError) as exc:  # the same messages the API answers with
        raise CliError(str(exc)) from exc


def cmd_token(a) -> int:
    """Personal API tokens over HTTP, as the PARALAB_TOKEN user or after a password login."""
    from backend.cli.users import cli_token
    return cli_token(a, _url(), _auth_headers(), CliError)


def cmd_up(a) -> int:
    from backend.launcher import up
    return up(host=a.host, port=a.port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="paralab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("up", help="migrations + API/front end + a worker (the embedded default)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.set_defaults(fn=cmd_up)
    s = sub.add_parser("serve", help="the API and front end")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.set_defaults(fn=cmd_serve)
    s = sub.add_parser("worker", help="a Celery worker that launches torchrun jobs")
    s.add_argument("--queue")
    s.add_argument("--slots", type=int)
    s.set_defaults(fn=cmd_worker)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(fn=cmd_migrate)
    s = sub.add_parser("users", help="accounts, on the backend host's database (operators)")
    us = s.add_subparsers(dest="users_cmd", required=True)
    u = us.add_parser("create", help="create a user (the first admin: --admin)")
    u.add_argument("name")
    u.add_argument("--admin", action="store_true", help="same as --role admin")
    u.add_argument("--role", choices=["viewer", "member", "admin"], default="member")
    u.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    us.add_parser("list", help="list users")
    u = us.add_parser("set", help="change a user's role, limits, active flag or password")
    u.add_argument("name")
    u.add_argument("--role", choices=["viewer", "member", "admin"])
    u.add_argument("--max-concurrent-runs", type=int)
    u.add_argument("--max-world-size", type=int)
    u.add_argument("--active", choices=["yes", "no"])
    u.add_argument("--password-stdin", action="store_true", help="new password from stdin")
    s.set_defaults(fn=cmd_users)
    s = sub.add_parser("token", help="personal API tokens (for PARALAB_TOKEN)")
    ts = s.add_subparsers(dest="token_cmd", required=True)
    t = ts.add_parser("create", help="create a token; it is printed once")
    t.add_argument("--name", default="cli")
    t.add_argument("--expires-days", type=float)
    ts.add_parser("list", help="your tokens (prefix, last used)")
    t = ts.add_parser("revoke", help="revoke a token by its id")
    t.add_argument("id", type=int)
    for t in ts.choices.values():
        t.add_argument("--json", action="store_true")
        t.add_argument("--user", help="log in as this user (else PARALAB_TOKEN is used)")
        t.add_argument("--password-stdin", action="store_true")
    s.set_defaults(fn=cmd_token)

    s = sub.add_parser("submit", help="submit a run: SPEC.json and/or --preset NAME")
    s.add_argument("spec", nargs="?", help="job spec JSON file ('-' for stdin)")
    s.add_argument("--preset")
    s.add_argument("--name")
    s.add_argument("--wait", action="store_true", help="wait until it finishes")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_submit)
    s = sub.add_parser("runs", help="list runs")
    for flag in ("--status", "--strategy", "--owner", "--tag", "--q", "--sort"):
        s.add_argument(flag)
    s.add_argument("--limit", type=int, default=50)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_runs)
    s = sub.add_parser("show", help="one run")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_show)
    s = sub.add_parser("logs", help="a run's log")
    s.add_argument("id")
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("--rank", type=int)
    s.set_defaults(fn=cmd_logs)
    s = sub.add_parser("cancel", help="cancel a queued or running run")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_cancel)
    s = sub.add_parser("predict", help="memory / traffic / bubble prediction of a spec or what-if")
    s.add_argument("spec", nargs="?", help="job spec or what-if JSON file ('-' for stdin)")
    s.add_argument("--preset")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_predict)
    s = sub.add_parser("export", help="download a run's Perfetto trace or analysis tables")
    s.add_argument("id")
    s.add_argument("--format", choices=["perfetto", "json", "csv"], default="perfetto")
    s.add_argument("--table", help="one analysis table (csv/json)")
    s.add_argument("-o", "--output")
    s.set_defaults(fn=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except CliError as exc:
        print(f"paralab: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
