PY ?= python3
PORT ?= 8443
VENV := .venv
BIN := $(VENV)/bin
VCSIM := deploy/vcsim/bin/vcsim-gw
BOOTSTRAP := deploy/bootstrap.sh

.PHONY: bootstrap test test-fast run lab-test bench bench-sweep lint vcsim venv man dist

# Installs the Debian packages the project needs when missing (as root; otherwise prints the sudo line
# and stops). Every entry point starts with it: `make run` (only the demo's set: BOOTSTRAP_SET=run,
# which its prerequisites inherit), `make test`, `make lint`, .ci/run (everything).
BOOTSTRAP_SET ?=
bootstrap:
	@bash $(BOOTSTRAP)$(if $(BOOTSTRAP_SET), $(BOOTSTRAP_SET))

$(BIN)/gateway: pyproject.toml | bootstrap
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: bootstrap $(BIN)/gateway

$(VCSIM): $(wildcard deploy/vcsim/*.go) deploy/vcsim/build.sh | bootstrap
	bash deploy/vcsim/build.sh

vcsim: bootstrap $(VCSIM)

# the identity tests' OpenID provider: the npm package oidc-provider, pinned by its lock file
OIDC := tests/oidc/node_modules/.package-lock.json
$(OIDC): tests/oidc/package.json tests/oidc/package-lock.json | bootstrap
	cd tests/oidc && npm ci --no-audit --no-fund --prefer-offline

# the official MCP conformance suite and the Node it needs (tests/server/edge/test_conformance.py), pinned by
# its lock file
CONFORMANCE := tests/conformance/node_modules/.package-lock.json
$(CONFORMANCE): tests/conformance/package.json tests/conformance/package-lock.json | bootstrap
	cd tests/conformance && npm ci --no-audit --no-fund --prefer-offline

test: bootstrap venv $(OIDC) $(CONFORMANCE)
	@bash deploy/vcsim/build.sh || echo "vcsim launcher could not be built; simulator tests will skip (fail under CI=true)"
	$(BIN)/python -m pytest

# The fast tier: every test that needs no simulator, PostgreSQL, Chromium or Node and builds or soaks
# nothing (the markers in pyproject.toml). TEST_TIER=fast makes any fixture or helper that would start one
# fail the test, so a test missing its marker shows here instead of slipping in.
FAST_TIER := not simulator and not postgres and not browser and not oidc and not node and not slow
test-fast: bootstrap venv
	TEST_TIER=fast $(BIN)/python -m pytest -p no:cacheprovider -m "$(FAST_TIER)"

lint: venv
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy --strict gateway

# the man page, generated from the same parser as `gateway --help` and `gateway completion bash|zsh`
MANPAGE ?= build/man/gateway.1
man: venv
	@mkdir -p $(dir $(MANPAGE))
	$(BIN)/argparse-manpage --module gateway.cli --function build_parser --prog gateway \
	    --project-name vsphere-mcp-gateway --manual-title "vSphere MCP Gateway" --output $(MANPAGE)

# the wheel and the sdist (dist/), what deploy/systemd and deploy/container install
dist: venv
	$(BIN)/python -m build --outdir dist .

run: BOOTSTRAP_SET := run
run: bootstrap venv vcsim
	$(BIN)/python -m gateway.dev.demo --port $(PORT)

# Read-only tests against your own lab vCenters (tests/lab): LAB_TARGETS_FILE names a targets.yaml, each
# target's <PREFIX>_USER/<PREFIX>_PASSWORD are exported; the gateway runs read-only and the suite sends
# no write. `make test` runs the same suite against two simulators (tests/test_lab_suite.py).
lab-test:
	@if [ -z "$$LAB_TARGETS_FILE" ]; then \
	    echo "lab-test: set LAB_TARGETS_FILE to a targets.yaml of your lab's vCenters and export each target's <PREFIX>_USER and <PREFIX>_PASSWORD (the suite only reads)" >&2; \
	    exit 2; \
	fi
	@[ -x $(BIN)/python ] || $(MAKE) --no-print-directory venv BOOTSTRAP_SET=run
	$(BIN)/python -m pytest tests/lab -p no:cacheprovider

bench: venv vcsim
	$(BIN)/python bench/run_all.py

# The sweeping list rows alone (also part of `make bench`): 3,000 and 30,000 VMs, before and after.
bench-sweep: venv vcsim
	$(BIN)/python bench/sweep.py
