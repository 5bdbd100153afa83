PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
VCSIM := deploy/vcsim/bin/vcsim-gw

.PHONY: test run bench lint vcsim venv

$(BIN)/gateway: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/gateway

$(VCSIM): $(wildcard deploy/vcsim/*.go) deploy/vcsim/build.sh
	bash deploy/vcsim/build.sh

vcsim: $(VCSIM)

test: venv
	@bash deploy/vcsim/build.sh || echo "vcsim launcher could not be built; simulator tests will skip (fail under CI=true)"
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy --strict gateway

run: venv vcsim
	$(BIN)/python -m gateway.demo

bench: venv vcsim
	$(BIN)/python bench/run_all.py
