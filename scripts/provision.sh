#!/usr/bin/env bash
# Make sure the servers the test suite talks to exist and run: Redis, PostgreSQL (and, for the
# browser tests, Chromium). Installs them with apt when absent (fresh machine), starts them
# when stopped, and prints the PostgreSQL URL the tests should use on the last line.
set -euo pipefail

log() { echo "provision: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" = 0 ]; then as_root apt-get update -qq >&2; APT_UPDATED=1; fi
  log "installing $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# --- Redis ---------------------------------------------------------------------------------------
command -v redis-server >/dev/null || apt_install redis-server
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  log "starting redis"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.2; done
fi

# --- Chromium (browser tests drive Debian's build through Playwright; no browser download) ---
if ! command -v chromium >/dev/null; then apt_install chromium chromium-driver; fi

# --- PostgreSQL ----------------------------------------------------------------------------------
if ! command -v pg_ctlcluster >/dev/null; then apt_install postgresql; fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  log "starting postgresql"
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2 || true
  for _ in $(seq 100); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 0.2; done
fi
if [ -n "${PARALAB_TEST_PG_URL:-}" ]; then
  echo "$PARALAB_TEST_PG_URL"
elif psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
  # This kind of machine: trust auth on TCP, database `test`.
  echo "postgresql+psycopg://postgres@127.0.0.1:5432/test"
else
  # A fresh Debian install: peer auth on the socket; give the current user a superuser role.
  me=$(id -un)
  as_root runuser -u postgres -- psql -Atc "select 1 from pg_roles where rolname='$me'" \
    | grep -q 1 || as_root runuser -u postgres -- createuser -s "$me" >&2
  psql -d postgres -Atc "select 1 from pg_database where datname='test'" | grep -q 1 \
    || createdb test >&2
  echo "postgresql+psycopg:///test?host=/var/run/postgresql"
fi
