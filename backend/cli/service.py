"""Service commands: `up` (migrations + API + worker, what `make run` starts), `serve`,
`worker`, `migrate`, and the operator commands `users` / `token` (backend/cli/users.py)."""

from __future__ import annotations

import os
import sys

from backend.cli.client import CliError, _auth_headers, _url


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
    from backend.main import _schema_behind
    if behind := _schema_behind(settings.db_url):  # served anyway: /api/health says so (503)
        sys.stderr.write(f"paralab serve: {behind}\n")
    uvicorn.run(app, host=host, port=a.port or settings.port,
                log_level="info", timeout_graceful_shutdown=5)
    return 0


def cmd_worker(a) -> int:
    if a.queue:
        os.environ["PARALAB_QUEUE"] = a.queue
    if a.slots:
        os.environ["PARALAB_WORKER_SLOTS"] = str(a.slots)
    from backend.core.config import get_settings
    from paralab_core.queue import get_celery, node_queue, worker_name
    settings = get_settings()
    app = get_celery(settings)
    # its pool's queue, and its own: the nodes of multi-host runs placed on this worker
    queues = f"{settings.queue},{node_queue(worker_name(settings))}"
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(settings.worker_slots),
                     "--queues", queues, "--hostname", worker_name(settings),
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
