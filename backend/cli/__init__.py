"""`paralab` command line: the parser and `main`. Client commands (HTTP to PARALAB_URL) are in
client.py (`sweep ...`: sweeps.py), service commands (up, serve, worker, migrate, users, token)
in service.py, the user and token commands in users.py. Errors print as `paralab: <message>`,
exit code 2 (3: the server cannot be reached).
"""

from __future__ import annotations

import argparse
import sys

from backend.cli.client import (
    CliError,
    cmd_cancel,
    cmd_checkpoints,
    cmd_export,
    cmd_logs,
    cmd_predict,
    cmd_resume,
    cmd_runs,
    cmd_show,
    cmd_submit,
)
from backend.cli.imports import add_parser as add_import_parser
from backend.cli.service import (
    cmd_migrate,
    cmd_serve,
    cmd_token,
    cmd_up,
    cmd_users,
    cmd_worker,
)
from backend.cli.sweeps import add_parser as add_sweep_parser

__all__ = ["CliError", "build_parser", "main"]


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
    u.add_argument("--max-slot-hours", type=float,
                   help="world size x hours over PARALAB_QUOTA_WINDOW_S (< 0: the default)")
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
    s.add_argument("--script", metavar="ENTRY", help="your own training script: a .py path "
                   "in --workdir, or '-m pkg.module' (docs/scripts.md); its arguments after --")
    s.add_argument("--workdir", help="the folder uploaded with --script (.gitignore honoured)")
    s.add_argument("--nproc", type=int, help="--script: ranks (runtime.nproc_per_node)")
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
    s = sub.add_parser("checkpoints", help="a run's complete checkpoints (resumable)")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_checkpoints)
    s = sub.add_parser("resume", help="a new run continuing RUN from a complete checkpoint")
    s.add_argument("id", help="the run to continue")
    s.add_argument("--step", type=int, help="the checkpoint (default: the latest complete one)")
    s.add_argument("overrides", nargs="?", help="JSON file of spec overrides (parallel, "
                   "runtime, train, name): a new layout reshards where it can")
    s.add_argument("--name")
    s.add_argument("--wait", action="store_true", help="wait until it finishes")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_resume)
    s = sub.add_parser("predict", help="memory / traffic / bubble prediction of a spec or what-if")
    s.add_argument("spec", nargs="?", help="job spec or what-if JSON file ('-' for stdin)")
    s.add_argument("--preset")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_predict)
    s = sub.add_parser("export", help="download a run's Perfetto trace, analysis tables, "
                       "Kineto traces (HTA / TensorBoard), flight records (torch's fr_trace) "
                       "or a checkpoint (torch.distributed.checkpoint)")
    s.add_argument("id")
    s.add_argument("--format", choices=["perfetto", "json", "csv", "kineto", "flight",
                                        "checkpoint"], default="perfetto")
    s.add_argument("--table", help="one analysis table (csv/json)")
    s.add_argument("--rank", type=int, help="kineto: one rank's trace instead of the zip")
    s.add_argument("--step", type=int, help="checkpoint: its step (default: the latest)")
    s.add_argument("-o", "--output")
    s.set_defaults(fn=cmd_export)
    add_sweep_parser(sub)
    add_import_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `paralab submit --script train.py -- --lr 3e-4`: what follows `--` is the script's own
    # argv, passed on as a list (never parsed here, never through a shell)
    script_args: list[str] = []
    if argv[:1] == ["submit"] and "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    args.script_args = script_args
    if script_args and not getattr(args, "script", None):
        print("paralab: arguments after -- are a script's: give --script ENTRY",
              file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except CliError as exc:
        print(f"paralab: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
