# sandboxd — the two commands: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8765
STATE ?= .state

.PHONY: run test test-vm venv venv-dev docker images node mcp-inspector e2b-js doc-tools haproxy typecheck test-bytecode lint bench clean

# A virtualenv with the daemon installed (Debian's python3 needs python3-venv for this).
# The packages are installed by uv (from PyPI, into the virtualenv by pip): a fresh clone's
# virtualenv with the dev tools in ~8 s, against ~23 s with pip (its resolution, and the
# bytecode of every file compiled at install: here a module's is written by the first
# process that imports it). pip stays in it, upgraded (tests/vm/ci.sh runs it).
UV := UV_LINK_MODE=copy $(BIN)/uv pip install -q --python $(BIN)/python

# Bytecode is written (some hosts set PYTHONDONTWRITEBYTECODE, CI's among them): else every
# test daemon, CLI and worker process compiles every module it imports, each time.
unexport PYTHONDONTWRITEBYTECODE
$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 && $(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  (echo "installing python3-venv"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv
	$(UV) --upgrade pip -e .
	@touch $@

$(BIN)/.installed-dev: $(BIN)/.installed
	$(UV) -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed
venv-dev: $(BIN)/.installed-dev

## make run: install into a virtualenv and start the daemon on its embedded default
## (restricted-interpreter backend, default policy, loopback only), with every tool working:
## the Docker engine is made sure of first (as for make test; without one, python still serves
## and the container tools' 503 says why), and the daemon builds the sandbox images it lacks
## itself, offline, in the background (setting build_images): it serves python at once, the
## log shows each build step, /readyz and a container tool's 503 say what is being built, and
## the tool works once the build is done.
## make run PROFILE=datascience: the data-science image too and its policy
## (policies/examples/datascience.yaml: pandas, matplotlib... in containers) for the local,
## tokenless client. `sandboxd serve` equivalent: `SANDBOXD_BUILD_IMAGES=python,datascience
## sandboxd serve --policies policies/examples`.
PROFILE ?=
PROFILES := datascience
comma := ,
run: venv
	@if [ -n "$(PROFILE)" ]; then case " $(PROFILES) " in *" $(PROFILE) "*) ;; *) echo "make run: unknown PROFILE '$(PROFILE)' (known: $(PROFILES))" >&2; exit 2;; esac; fi
	@scripts/ensure-docker.sh || echo "make run: no Docker engine here: python (restricted backend) serves; the container tools answer 503 saying why"
	@echo "sandboxd: serving on http://$(HOST):$(PORT) (state in $(STATE)/$(if $(PROFILE),; profile $(PROFILE): policies/examples/$(PROFILE).yaml)). Try:"
	@echo "  curl -s $(HOST):$(PORT)/v1/tools/python/invoke -H 'content-type: application/json' -d '{\"arguments\":{\"code\":\"print(6*7)\"}}'"
	@echo "  curl -s $(HOST):$(PORT)/v1/tools?format=openai"
	@echo "  curl -s $(HOST):$(PORT)/readyz    # .images: the sandbox images being built, if any"
	@echo "  $(BIN)/sandboxd invoke python --arg code='print(6*7)'"
	@echo "MCP (Streamable HTTP): http://$(HOST):$(PORT)/mcp; stdio bridge for MCP hosts: $(BIN)/sandboxd mcp --url http://$(HOST):$(PORT)"
	@echo "Admin commands for this daemon's state ($(STATE)/):"
	@echo "  $(BIN)/sandboxd audit verify --state-dir $(abspath $(STATE))"
	@echo "  $(BIN)/sandboxd audit tail -f --state-dir $(abspath $(STATE))"
	@echo "  $(BIN)/sandboxd doctor --state-dir $(abspath $(STATE))"
	@echo "Beside another daemon as root (an installed service), sandbox uids must differ: serve names a"
	@echo "  free range if the default one is taken; pass it as SANDBOXD_SANDBOX_UID_FIRST=N make run"
	@echo "Stop with Ctrl-C."
	SANDBOXD_BUILD_IMAGES=python$(if $(PROFILE),$(comma)$(PROFILE)) exec $(BIN)/sandboxd serve --host $(HOST) --port $(PORT) --state-dir $(STATE) $(if $(PROFILE),--policies policies/examples)

## Docker engine (Debian's docker.io, dockerd started if not running) and the sandbox images.
docker:
	scripts/ensure-docker.sh

## Each is built only when missing or older than images/ (cached otherwise). The datascience
## image (tests/datascience) is built here but never copied into the VM (tests/vm/ci.sh).
## The lines start with + : make test's --output-sync=target would hold back their output (a
## line per build step, one every 20 s through a long step) until the end of a build of
## minutes; + lines are not synchronized (and, like $(MAKE) lines, run under make -n too).
images: venv docker
	+$(BIN)/sandboxd images build --offline --if-missing
	+$(BIN)/sandboxd images build --offline --if-missing --profile datascience
	+$(BIN)/sandboxd images build --offline --if-missing --profile javascript

## The MCP Inspector CLI for tests/mcp (a client no one on this project wrote): Debian's nodejs
## and npm when node is missing (Debian 12: node 18), then the pinned tree (Inspector 0.15.0,
## nothing in it needs more than node 18) into .cache/npm, so the tests download nothing.
NPM_CACHE ?= .cache/npm
INSPECTOR := $(NPM_CACHE)/node_modules/@modelcontextprotocol/inspector/cli/build/cli.js

node:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || \
	  (echo "installing nodejs and npm"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null)

$(INSPECTOR): tests/mcp/inspector/package.json tests/mcp/inspector/package-lock.json | node
	mkdir -p $(NPM_CACHE)
	cp tests/mcp/inspector/package.json tests/mcp/inspector/package-lock.json $(NPM_CACHE)/
	cd $(NPM_CACHE) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

mcp-inspector: $(INSPECTOR)

## E2B's JavaScript SDK for tests/e2b/test_js.py: the pinned tree (@e2b/code-interpreter
## 2.8.0, which needs node >= 20.18.1) into .cache/npm/e2b-js, so the tests download nothing.
E2B_JS := $(NPM_CACHE)/e2b-js/node_modules/@e2b/code-interpreter/package.json

$(E2B_JS): tests/e2b/js/package.json tests/e2b/js/package-lock.json | node
	mkdir -p $(NPM_CACHE)/e2b-js
	cp tests/e2b/js/package.json tests/e2b/js/package-lock.json $(NPM_CACHE)/e2b-js/
	cd $(NPM_CACHE)/e2b-js && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

e2b-js: $(E2B_JS)

## The programs the shell examples of the README and docs/ call (tests/docs runs them).
doc-tools:
	@command -v curl >/dev/null 2>&1 && command -v jq >/dev/null 2>&1 || \
	  (echo "installing curl and jq"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl jq >/dev/null)

## Debian's HAProxy (2.6 on Debian 12) for tests/fleet: several daemons behind a real proxy.
## The package's own service is not needed: the tests start haproxy themselves.
haproxy:
	@command -v haproxy >/dev/null 2>&1 || test -x /usr/sbin/haproxy || \
	  (echo "installing haproxy"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null)

## make typecheck: mypy on the sandboxd package, the client and the in-container runner
## (images/runner) as [tool.mypy] in pyproject.toml says (--strict on all of them, no module
## left out). make test runs it first: seconds, and it fails
## before the Docker engine, the images and the suite are waited for.
## Its cache is kept beside uv's and npm's (MYPY_CACHE), not in the checkout: a fresh clone on
## a machine that checked a tree before checks only what differs (mypy compares the files'
## hashes; a cold check is ~20 s here, a warm one ~1 s).
MYPY_CACHE ?= $(HOME)/.cache/sandboxd/mypy
typecheck: venv-dev
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)

## make test: the type check, everything the tests need (dev tools, Docker engine, sandbox
## images, the MCP Inspector, curl and jq, haproxy), then pytest.
## PYTEST_ARGS: e.g. "--reruns 1" (CI: a rerun is named FLAKY at the end), "-x tests/api".
## TEST_WORKERS: pytest processes side by side (pytest-xdist, a test file's tests stay in one
## of them: module fixtures are shared as before); most tests wait on daemons, engines and
## sandboxes, so four workers still gain on these 2-core machines (pytest, a fresh clone at
## a9dc937: 2 workers 430 s, 3 workers 352 s, 4 workers 327 s). 1: one process, as before.
PYTEST_ARGS ?=
TEST_WORKERS ?= 4
## What needs Debian's packages is done first, one at a time (apt has one lock); then the
## virtualenv with the type check, the images and the bytecode, beside the MCP Inspector's
## npm tree.
## The dev install first: it reinstalls the package, and `images` runs .venv/bin/sandboxd (run
## beside it, that entry point was briefly missing).
test: docker node doc-tools haproxy
	@$(MAKE) --no-print-directory venv-dev
	@$(MAKE) --no-print-directory -j3 --output-sync=target typecheck images mcp-inspector e2b-js test-bytecode
	$(BIN)/pytest -ra $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

## pytest's rewrite of the test modules (their asserts) and their bytecode, written once
## before the run (a collection, beside the type check): else each of the four pytest workers
## rewrites the same ~450 modules, ~5 s of CPU each. The rest of the bytecode is written by
## the first process that imports a module (PYTHONDONTWRITEBYTECODE is unexported above).
test-bytecode: venv-dev
	@$(BIN)/pytest -q --co -p no:xdist -p no:cacheprovider > $(VENV)/collect.log 2>&1 \
	  || { cat $(VENV)/collect.log; exit 1; }

## make test-vm: the modern-host test. A Debian 12 VM (systemd 252, cgroup v2; image built
## offline with debootstrap, cached in /var/cache/sandboxd-vm) installs sandboxd as a systemd
## service exactly as docs/operations.md says, checks it, and runs the test suite inside
## (CI=true). See tests/vm/README.md. VM_ARGS: e.g. --jobs service, --test-dirs "restricted".
test-vm: venv images
	VM_HOST_PYTHON=$(abspath $(BIN))/python tests/vm/ci.sh $(VM_ARGS)

lint: venv-dev typecheck
	$(BIN)/ruff check sandboxd client tests bench images/runner

bench: venv images
	$(BIN)/python bench/bench_restricted.py
	$(BIN)/python bench/bench_container.py
	$(BIN)/python bench/bench_daemon.py
	$(BIN)/python bench/bench_mcp_bridge.py
	$(BIN)/python bench/bench_runner_spawn.py

## make clean: the state directory through `sandboxd clean` (a stop that kept sessions leaves
## their tmpfs workspaces mounted and their containers running: rm -rf fails on those); it
## refuses, in one line, while a daemon serves that directory (then nothing is removed).
clean:
	@if [ -d $(STATE) ]; then \
	  if [ -x $(BIN)/sandboxd ]; then $(BIN)/sandboxd clean --state-dir $(STATE); \
	  else rm -rf $(STATE); fi; \
	fi
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
