PY ?= python3
PORT ?= 8443
VENV := .venv
BIN := $(VENV)/bin
VCSIM := deploy/vcsim/bin/vcsim-gw
BOOTSTRAP := deploy/bootstrap.sh

.PHONY: bootstrap test run bench lint vcsim venv man dist

# Installs the Debian packages the project needs when missing (as root; otherwise prints the sudo line
# and stops). Every entry point starts with it: `make run`, `make test`, `make lint`, .ci/run.
bootstrap:
	@bash $(BOOTSTRAP)

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


test: bootstrap venv $(OIDC)
	@bash deploy/vcsim/build.sh || echo "vcsim launcher could not be built; simulator tests will skip (fail under CI=true)"
	$(BIN)/python -m pytest

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

run: bootstrap venv vcsim
	$(BIN)/python -m gateway.demo --port $(PORT)

bench: venv vcsim
	$(BIN)/python bench/run_all.py
