# Two commands (README): `make serve` and `make test`. Both set everything up, idempotently.
#
# The environment is locked: `uv.lock` pins every Python package (torch, transformers, ...) and
# `Cargo.lock` every crate. `uv sync --locked` makes `.venv` from the lock (installing from uv's global
# download cache, so a second clone's setup takes seconds) and builds this project into it as an
# editable maturin install (`_core` is rebuilt when a Rust source changes: pyproject's cache-keys).
# Refresh the lock with `make lock` (then run `make test` and commit uv.lock).
#
# uv itself is bootstrapped with pip at a pinned version into .uv/ when it is not on PATH.

SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV ?= $(shell command -v uv 2>/dev/null || echo .uv/bin/uv)
VENV := .venv
VPY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=
# pytest processes run side by side over disjoint test files (scripts/pytest_shards.py); 1: one plain pytest.
PYTEST_SHARDS ?= 2

.PHONY: setup serve test test-rust test-python bench lock clean

setup: $(UV)
	$(UV) sync --locked

.uv/bin/uv:
	@echo ">> bootstrapping uv $(UV_VERSION) into .uv/ (uv is not on PATH)"
	$(PYTHON) -m pip install -q --disable-pip-version-check --target .uv "uv==$(UV_VERSION)"
	test -x $@

serve: setup
	$(VENV)/bin/yoco-serve --host $(HOST) --port $(PORT)

test: setup test-rust test-python

test-rust:
	cargo test --locked --workspace --exclude yoco-py --profile ci

test-python: setup
	$(VPY) scripts/pytest_shards.py --shards $(PYTEST_SHARDS) $(PYTEST_ARGS)

bench: setup
	$(MAKE) -C benches all VPY=$(abspath $(VPY))

# Re-resolve every Python dependency to the newest versions pyproject allows.
lock: $(UV)
	$(UV) lock --upgrade

clean:
	rm -rf $(VENV) .uv python/yoco_rs/_core*.so
