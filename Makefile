# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.paralab-installed

.PHONY: run test install lint bench clean

# Reinstalled only when pyproject.toml changes, so a second `make run` starts in seconds.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	@exec $(VENV)/bin/paralab up

test: $(STAMP)
	@bash scripts/test.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf var test-artifacts
