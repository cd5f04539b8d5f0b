# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.paralab-installed
LOCK   := requirements.lock

.PHONY: run test install lock lint bench clean

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

# Re-pin every dependency to the newest versions pyproject.toml allows (a fresh venv in /tmp).
lock:
	@PYTHON=$(PYTHON) bash scripts/lock.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf var test-artifacts
