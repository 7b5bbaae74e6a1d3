# The two commands of the README: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup setup-ui run test test-fast test-faults-stack test-ui lint bench clean stack-up stack-down stack-status image \
	stack-docker-up stack-docker-down stack-e2e

# Debian's nginx-light (the container stack's proxy, run by the credential tests) and dataset-fashion-mnist
# (Fashion-MNIST's idx files, offline) are installed when missing, as setup-ui
# installs chromium (root, or sudo without a password prompt); where that fails setup still succeeds and the tests
# that read the package are skipped with the reason (`sudo apt-get install dataset-fashion-mnist` later enables them)
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist

setup: $(STAMP)
	@if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then \
	  echo "installing Debian's nginx-light: tests/integration/test_access.py runs the stack's proxy (infra/proxy/)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	  { command -v apt-get >/dev/null && $$SUDO apt-get update -qq && \
	    $$SUDO apt-get install -y -qq --no-install-recommends nginx-light && \
	    { $$SUDO nginx -s quit 2>/dev/null || true; }; } || \
	  echo "could not install nginx-light (needs apt-get and root or sudo): the proxy's tests will fail"; \
	fi
	@if [ ! -d $(FASHION_MNIST_DIR) ]; then \
	  echo "installing Debian's dataset-fashion-mnist for the fashion-mnist dataset"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	  { command -v apt-get >/dev/null && $$SUDO apt-get update -qq && \
	    $$SUDO apt-get install -y -qq dataset-fashion-mnist; } || \
	  echo "could not install dataset-fashion-mnist (needs apt-get and root or sudo): fashion-mnist needs" \
	       "--from DIR, and its package tests are skipped"; \
	fi

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	touch $(STAMP)

# the two-Gaussian sweeps, then mnist-5k (LeNet trained on CPU, 20 epochs; BCTS; 100-seed Dirichlet-shift sweeps),
# the results page; then the operator's side once: label-shifted mnist-5k batches arrive under <store>/target and
# are re-estimated with the model the sweep registered (a second `estimate` finds no new data)
run: setup
	$(BIN)/labelshift reproduce
	$(BIN)/labelshift reproduce --dataset mnist-5k
	$(BIN)/labelshift report
	$(BIN)/labelshift data simulate-target mnist-5k --alpha 5.0 --batches 2 --rows 200 --seed $$(date +%s)
	$(BIN)/labelshift estimate --model models:/labelshift-mnist-5k@latest-good

# the suite on TEST_WORKERS pytest-xdist processes (default 2; `make test TEST_WORKERS=0` runs it in this process):
# each worker starts its own servers on free ports, and a test file stays on one worker (its module fixtures once)
TEST_WORKERS ?= 2

# (the local stack's servers killed and frozen under a run are test-faults-stack's, apart: they take minutes)
FAULTS_STACK := tests/integration/test_faults_stack.py

test: setup lint
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) \
	  --ignore=$(FAULTS_STACK)

# local stacks on free ports; their Prefect server, MLflow server and SeaweedFS each killed and frozen while
# `labelshift estimate` runs on it, each followed by a run to completion (docs/operations.md, "Faults").
# The cases run on FAULT_WORKERS pytest-xdist workers (default 3), a stack each: they mostly wait on timeouts
# (7:40 on three against 14-16 minutes one after another on an idle machine). Stacks started at once once raced for
# a free port (weed's volume gRPC port "address already in use"); free_ports (runtime/processes.py) now draws ports
# outside the kernel's ephemeral range and reserves them across processes for 10 minutes. FAULT_WORKERS=0 runs
# them one after another.
FAULT_WORKERS ?= 3

test-faults-stack: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider $(if $(filter 0,$(FAULT_WORKERS)),,-n $(FAULT_WORKERS) --dist load) \
	  $(FAULTS_STACK)

# ruff with the small rule set of pyproject.toml; the layering (flows -> tasks -> labelshift) is tests/architecture/test_layering.py
lint: setup
	$(BIN)/ruff check .

test-fast: setup
	$(BIN)/python -m pytest -q -m "not integration"

# The UIs as a person sees them (tests_ui/): headless Chromium driven by Playwright against a local stack and
# `labelshift serve` on free loopback ports; screenshots of each step in .labelshift/ui-screens/. Playwright's
# own browser download is not used: Debian's chromium is installed when missing (needs root or sudo).
UI_STAMP := $(VENV)/.installed-ui
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser)

setup-ui: setup $(UI_STAMP)
	@if [ -z "$(CHROMIUM)" ]; then \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; \
	fi

$(UI_STAMP): pyproject.toml
	$(BIN)/python -m pip install -e '.[test,ui]'
	touch $(UI_STAMP)

test-ui: setup-ui
	$(BIN)/python -m pytest -q -p no:cacheprovider tests_ui

clean:
	rm -rf $(VENV) .labelshift build *.egg-info

# The local stack without Docker (SeaweedFS S3, MLflow server, Prefect server on loopback); see infra/README.md.
stack-up: setup
	$(BIN)/labelshift stack up $(STACK_ARGS)

stack-down: setup
	$(BIN)/labelshift stack down

stack-status: setup
	$(BIN)/labelshift stack status

# Containers (infra/README.md). `make image` builds the worker image of ./Dockerfile and Prefect's PostgreSQL image
# (infra/postgres/) on BASE_IMAGE; the default base, labelshift-base:bookworm, is made from Debian's packages with
# mmdebstrap when it is missing (no image registry needed). BASE_IMAGE=debian:bookworm-slim uses Docker Hub's.
# Needs Docker running (`apt-get install -y docker.io docker-compose mmdebstrap`; the check names what is missing).
BASE_IMAGE ?= labelshift-base:bookworm
image:
	BASE_IMAGE=$(BASE_IMAGE) $(PYTHON) -m infra.image

# The stack of infra/compose.yaml with two CPU workers, settings and secrets from infra/.env (cp infra/env.example)
stack-docker-up:
	$(PYTHON) -m infra.compose_stack up --workers 2

stack-docker-down:
	$(PYTHON) -m infra.compose_stack down

# The end-to-end check of the images and the stack (infra/stack_e2e.py; about 12 minutes here, infra/README.md):
# its own compose project on free loopback ports, removed with its volumes at the end. Run it before each change
# to Dockerfile, infra/ or the dependencies.
stack-e2e: setup image
	$(BIN)/python -m infra.stack_e2e
