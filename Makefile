# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.paralab-installed
LOCK   := requirements.lock

.PHONY: run test install lock lint bench clean mutants

# Reinstalled only when pyproject.toml or the lock changes, so a second `make run` starts in
# seconds. The lock pins every dependency (README, Dependencies).
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c $(LOCK) -e '.[dev,fuzz]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	@exec $(VENV)/bin/paralab up

test: $(STAMP)
	@bash scripts/test.sh

# Plant each hand-written mutant of scripts/mutants.toml in a copy of the repo and run its tests
# (docs/testing.md): prints the score, writes test-artifacts/mutants.json, fails below 90 %.
# MUTANTS_ARGS passes options, e.g. MUTANTS_ARGS="-j 2" or MUTANTS_ARGS="--only ID".
mutants: $(STAMP)
	@PG_URL=$$(bash scripts/provision.sh | tail -n 1) || { echo "provisioning failed" >&2; exit 1; }; \
	mkdir -p test-artifacts; \
	PARALAB_TEST_PG_URL="$$PG_URL" \
	PARALAB_TEST_REDIS_URL="$${PARALAB_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}" \
	OMP_NUM_THREADS=1 $(PY) scripts/mutate.py --min-score 0.9 \
	  --out test-artifacts/mutants.json $(MUTANTS_ARGS)

# Re-pin every dependency to the newest versions pyproject.toml allows (a fresh venv in /tmp).
lock:
	@PYTHON=$(PYTHON) bash scripts/lock.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf var test-artifacts
