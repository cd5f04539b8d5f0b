"""One Settings object for the backend, the worker and the CLI (backend.core.config re-exports it).

Embedded default (no Redis, no PostgreSQL): SQLite under `data_dir`, Celery's `filesystem://`
broker and a `db+sqlite://` result backend. `REDIS_URL` / `DATABASE_URL` switch to the team
services. Every value can be set from the environment (`PARALAB_*`, plus the conventional
`DATABASE_URL` and `REDIS_URL`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARALAB_", extra="ignore")

    data_dir: Path = Path("var")
    database_url: str | None = Field(
        None, validation_alias=AliasChoices("DATABASE_URL", "PARALAB_DATABASE_URL"))
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("REDIS_URL", "PARALAB_REDIS_URL"))

    host: str = "127.0.0.1"
    port: int = 8000
    # Where workers and the CLI reach the backend.
    url: str = "http://127.0.0.1:8000"

    queue: str = "default"
    worker_slots: int = Field(1, ge=1, le=64)
    worker_name: str | None = None
    # The host a worker reports (the cluster page groups workers by it); default the hostname,
    # which inside a container is the container's ID, not the machine's.
    worker_host: str | None = None
    worker_token: str | None = None
    # How many ranks this worker hosts at once on a CPU host (a GPU host: its CUDA devices);
    # gang placement of multi-host runs counts them (docs/hosts.md). Default: its slots.
    worker_ranks: int | None = Field(None, ge=1, le=4096)
    # The address the other hosts reach this one at: node 0 of a multi-host run serves the
    # rendezvous (and rank 0's store) there. Default: the address the hostname resolves to.
    worker_address: str | None = None
    max_world_size: int = Field(8, ge=1)
    max_job_timeout_s: float = 7 * 86400.0
    job_omp_threads: int = 1
    # A running run whose worker has been silent this long is failed as "worker lost".
    run_heartbeat_timeout_s: float = 60.0
    worker_heartbeat_s: float = 5.0
    # a live stream without news re-reads the database this often (a lost pub/sub message costs
    # at most this much delay) and pings its client
    stream_recheck_s: float = Field(10.0, gt=0)
    run_heartbeat_s: float = 1.0
    # The embedded broker: a publish wakes the waiting workers at once (off: they find it at
    # their next poll, every 0.5 s; bench/lifecycle.py compares the two)
    broker_wake: bool = True
    # The API's cache of running runs' scratch conversions (their figures, Gantt and exports
    # read a Parquet copy of the shipped lines), in MiB: each charged its files plus its
    # analysis document; least recently used runs are dropped beyond it, a run larger than it
    # is served and not kept (backend/services/run_traces.py)
    analysis_cache_mb: float = Field(256.0, ge=0)
    # The API hands the pages of what that cache lets go back to the system and caps glibc's
    # malloc arenas at 2 (backend/core/memory.py); off only to measure what it saves
    # (bench/api_memory.py --no-trim)
    heap_trim: bool = True
    # While a job runs, its traces' final row groups are written to Parquet this often
    # (jobs/analysis/storage/convert_live.py), so the post-run conversion is left the last steps
    # only; 0: converted after the run only.
    live_convert_s: float = Field(2.0, ge=0)
    # ... and feeds them to the analysis (jobs/analysis/analyze_live.py; a run whose ranks
    # are all on this host), so that after the run only its last steps are left to analyse.
    live_analysis: bool = True
    # SIGTERM to torchrun, then SIGKILL to everything carrying the run's ID after this grace.
    kill_grace_s: float = 5.0
    # The reconciler (backend/services/reconcile.py): a queued run that no worker has claimed
    # this long while its queue has a free slot (or no worker at all) is published again; after
    # this many publications it fails with the reason (a lost message, no worker, a worker
    # whose PARALAB_WORKER_TOKEN the backend refuses).
    queue_claim_timeout_s: float = Field(120.0, gt=0)
    queue_claim_attempts: int = Field(3, ge=1)
    # POST /api/imports: most bytes one import stages, in MiB (files as uploaded, archive
    # members uncompressed; docs/imports.md)
    import_max_mb: int = Field(4096, ge=1)
    # POST /api/uploads (a user's working directory for their own script; docs/security.md
    # "User code"): the archive's size, what it unpacks to and its members, in MiB / count;
    # and the MiB of uploads each user may own in all.
    upload_max_mb: int = Field(256, ge=1)
    upload_max_unpacked_mb: int = Field(1024, ge=1)
    upload_max_files: int = Field(10_000, ge=1)
    upload_quota_mb: int = Field(2048, ge=0)
    # /api/health is degraded when the data directory's file system has less free space.
    disk_min_free_bytes: int = Field(1 << 30, ge=0)

    # -- accounts (docs/security.md) --------------------------------------------------------
    # "none": local mode, one implicit admin user `local`, loopback only. "required": team
    # mode, every API call and page needs a session or a personal API token.
    auth: Literal["none", "required"] = "none"
    # Signs session cookies; team mode refuses to start without a strong one (>= 32 chars).
    secret_key: str | None = None
    session_ttl_s: float = Field(7 * 86400.0, gt=0)
    # Secure flag on the session cookie: None = set it when the request came over https.
    cookie_secure: bool | None = None
    # Extra origins (scheme://host[:port]) accepted for cookie-authenticated writes, for a
    # reverse proxy that rewrites the Host header. The request's own Host is always accepted.
    trusted_origins: list[str] = []
    # Host header values answered, against DNS rebinding (a web page whose name resolves to
    # this server sends its own name as Host). Loopback names (127.0.0.1, localhost, [::1],
    # any port) are always answered, and are all that local mode answers. Team mode: a
    # comma-separated list of names, each with an optional :port ("*": any host); unset, the
    # host of PARALAB_URL when that is set, else any host (team mode authenticates every
    # request). The worker channel (/api/internal) is exempt: it needs the worker credential.
    allowed_hosts: str | None = None
    # Login throttling: this many failures for a username within the window, and further
    # attempts for it are refused (429) until the window has passed.
    login_max_failures: int = Field(10, ge=1)
    # Per client address (many users may share one address behind NAT or a proxy).
    login_max_failures_per_client: int = Field(50, ge=1)
    login_window_s: float = Field(300.0, gt=0)
    password_min_length: int = Field(10, ge=1)
    # argon2id cost (RFC 9106 "second recommended option" by default).
    argon2_time_cost: int = Field(3, ge=1)
    argon2_memory_kib: int = Field(65536, ge=8)
    argon2_parallelism: int = Field(4, ge=1)
    # Per-user limits for users without their own (None: no limit beyond max_world_size).
    default_max_concurrent_runs: int | None = Field(None, ge=0)
    default_user_max_world_size: int | None = Field(None, ge=1)
    # A token's last_used_at is written at most this often.
    token_touch_s: float = Field(60.0, ge=0)

    # -- bounded work per request (issue 36; docs/security.md, "Limits") ----------------------
    # (advise, predict, schedules: the search and simulator budgets, the rate limit)
    # POST /api/advise counts its search before it evaluates any layout and refuses one over a
    # bound with a 422 naming it (docs/advisor.md "Bounds"): layouts enumerated (pruned ones
    # included), candidates evaluated (each a spec parsed and predicted), schedule-simulator
    # actions over the candidates' distinct pipeline simulations.
    advise_max_layouts: int = Field(200_000, ge=1)
    advise_max_candidates: int = Field(10_000, ge=1)
    advise_max_sim_actions: int = Field(1_000_000, ge=1)
    # The search runs in this many child processes at most (outside the API's event loop and
    # GIL; a request that finds them all busy gets 503 + Retry-After), each killed past the
    # wall-clock bound and held to the address-space bound (RLIMIT_AS): a 422 that says so.
    advise_workers: int = Field(2, ge=1, le=64)
    advise_timeout_s: float = Field(60.0, gt=0)
    advise_memory_bytes: int = Field(1 << 30, ge=16 << 20)
    # Each of the theory's memos (evaluations, simulations), in bytes, least recently used
    # evicted; None: jobs.theory.bytecache.CACHE_BYTES.
    advise_cache_bytes: int | None = Field(None, ge=0)
    # Per user, in a sliding window: advise requests, and the other requests whose cost grows
    # with the request (POST /api/predict, GET /api/schedules/explore); over it: 429 with
    # Retry-After. A request refused for a field's rule (422) does not count; an advice
    # refused by the search budget does.
    rate_limit_window_s: float = Field(60.0, gt=0)
    rate_limit_advise: int = Field(10, ge=1)
    rate_limit_compute: int = Field(120, ge=1)

    # -- placement: no run waits forever ------------------------------------------------------
    # A multi-host run that the queue's hosts could not hold even when free (too few hosts, or
    # no worker with nproc_per_node ranks) is skipped by the placer, so it blocks no younger
    # run; one that stayed so this long (every worker seen meanwhile counted, so a restarting
    # host does not fail it) is failed with the reason (docs/hosts.md "Placement").
    gang_unplaceable_timeout_s: float = Field(600.0, gt=0)
    # /api/health is degraded while a queued run (one-host or multi-host) has waited longer.
    queue_wait_warn_s: float = Field(3600.0, gt=0)

    # -- streams, logs and the worker channel -------------------------------------------------
    # The worker channel (/api/internal) runs in threads of its own, this many at once: browser
    # pages and streams (FastAPI's shared pool of 40) can never take every thread it needs.
    worker_channel_threads: int = Field(16, ge=1, le=1000)
    # Streams behind the in-memory buffer read their backlog from the database in pages, at
    # most this many reads at once across all streams and log downloads (the others wait;
    # a read is mostly Python, so more at once mostly share the one interpreter lock).
    stream_replay_reads: int = Field(2, ge=1, le=1000)

    # -- quotas (team mode; shown in the new-run form) ----------------------------------------
    # backend/quotas.py, docs/security.md "Quotas". Team mode applies these defaults; local
    # mode (auth none) only those set explicitly. 0: no bound / no limit.
    # At submit (runs, every sweep member, resumes): runtime.timeout_s at most this, and the
    # hang watch on with runtime.hang_timeout_s at least this (its 0 = off is refused).
    # Admins are exempt in team mode.
    quota_max_timeout_s: float = Field(86400.0, ge=0)
    quota_min_hang_timeout_s: float = Field(30.0, ge=0)
    # Slot-hours (world size x hours) per user over this rolling window: finished runs count
    # what they used inside it, queued and running runs reserve world size x timeout_s.
    quota_window_s: float = Field(7 * 86400.0, gt=0)
    # For users without their own max_slot_hours (PATCH /api/users/{name}).
    default_max_slot_hours: float = Field(500.0, ge=0)

    @property
    def worker_alive_s(self) -> float:
        """A worker counts as live while its last heartbeat is this recent: three missed beats
        (one definition for health, /api/workers, the memory gate and the reconciler)."""
        return 3 * self.worker_heartbeat_s

    @property
    def db_url(self) -> str:
        if self.database_url:
            url = self.database_url
            if url.startswith("postgresql://") or url.startswith("postgres://"):
                url = "postgresql+psycopg://" + url.split("://", 1)[1]
            return url
        return f"sqlite:///{(self.data_dir / 'paralab.db').resolve()}"

    @property
    def host_allow_list(self) -> tuple[str, ...] | None:
        """The names beyond loopback answered as Host (`name` or `name:port`, lower case),
        or None for any host."""
        if self.auth != "required":
            return ()
        if self.allowed_hosts and self.allowed_hosts.strip():
            names = tuple(h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip())
            return None if "*" in names else names
        if "url" in self.model_fields_set:  # PARALAB_URL given: the public host
            host = urlsplit(self.url).hostname
            return (host,) if host else ()
        return None

    @property
    def broker_url(self) -> str:
        return self.redis_url or "filesystem://"

    @property
    def result_backend(self) -> str:
        if self.redis_url:
            return self.redis_url
        return f"db+sqlite:///{(self.data_dir / 'celery-results.db').resolve()}"

    @property
    def broker_dir(self) -> Path:
        return (self.data_dir / "broker").resolve()

    @property
    def runs_dir(self) -> Path:
        """Backend side: files uploaded by workers, one folder per run."""
        return (self.data_dir / "runs").resolve()

    @property
    def archive_limits(self):
        """An upload's bounds (paralab_core.archives.Limits): the backend checks an archive
        with them, the worker unpacks it with the same."""
        from paralab_core.archives import Limits
        return Limits(max_files=self.upload_max_files,
                      max_unpacked_bytes=self.upload_max_unpacked_mb << 20)

    @property
    def uploads_dir(self) -> Path:
        """Backend side: uploaded archives, one file per content (<sha256>.<kind>)."""
        return (self.data_dir / "uploads").resolve()

    @property
    def work_dir(self) -> Path:
        """Worker side: where jobs run and write their outputs before upload."""
        return (self.data_dir / "work").resolve()

    def resolved_worker_token(self) -> str:
        """The worker credential: from the environment, else a local file shared by the
        embedded backend and worker (both run on this host, under the same data_dir)."""
        if self.worker_token:
            return self.worker_token
        path = self.data_dir / "worker-token"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"worker-token.{secrets.token_hex(4)}.tmp")
            tmp.write_text(secrets.token_urlsafe(32))
            tmp.chmod(0o600)
            try:  # link() fails if another process won the race; both then read its token
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return path.read_text().strip()


@lru_cache
def get_settings() -> Settings:
    return Settings()


def job_timeout_s(spec: Mapping, cap_s: float) -> float:
    """A job's wall-clock limit: its spec's runtime.timeout_s, capped by the service's (the
    worker enforces it, the quotas count it)."""
    return min(float(spec["runtime"]["timeout_s"]), cap_s)
