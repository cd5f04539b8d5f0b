#!/usr/bin/env bash
# `make test`: provision the servers, then run the whole suite. An empty selection fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PG_URL=$(bash scripts/provision.sh | tail -n 1) || { echo "provisioning failed" >&2; exit 1; }
export PARALAB_TEST_PG_URL="$PG_URL"
export PARALAB_TEST_REDIS_URL="${PARALAB_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}"
export OMP_NUM_THREADS=1
mkdir -p test-artifacts
# where the time goes: CPU seconds per test (tests/conftest.py), summed by module at the end
export PARALAB_TEST_CPU_REPORT="${PARALAB_TEST_CPU_REPORT:-$PWD/test-artifacts/test-cpu.jsonl}"
rm -f "$PARALAB_TEST_CPU_REPORT"
# Independent modules run side by side (pytest-xdist): one worker per core plus one, at most 4
# (many tests wait on a service or a browser; on 2 cores 3 workers took 24:02 against 28:56
# serially, 2026-12-06), one on a single core. PARALAB_TEST_JOBS=1 runs everything in this
# process (what a debugger wants). GNU nproc answers OMP_NUM_THREADS, exported above: unset it.
CORES=$(env -u OMP_NUM_THREADS nproc)
JOBS="${PARALAB_TEST_JOBS:-$(( CORES < 2 ? 1 : (CORES + 1 < 4 ? CORES + 1 : 4) ))}"
XDIST=()
if [ "$JOBS" -gt 1 ]; then XDIST=(-n "$JOBS" --dist loadgroup); fi
.venv/bin/python -m pytest -p no:cacheprovider -q -rs --durations=25 "${XDIST[@]}" "$@"
rc=$?
if [ -s "$PARALAB_TEST_CPU_REPORT" ]; then
  .venv/bin/python scripts/test_cpu.py "$PARALAB_TEST_CPU_REPORT" --top 15 || true
fi
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: failing (an empty selection is never green)" >&2
  exit 1
fi
exit "$rc"
