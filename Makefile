# Two commands (README): `make serve` and `make test`. Both set everything up, idempotently.
#
# Where things live, so a fresh clone on the same machine is fast on its second run:
#   $(YOCO_HOME)/deps-<hash>   third-party Python deps (torch, transformers, ...), keyed by pyproject's
#                              dependency lists; shared by every checkout on this machine
#   $(YOCO_HOME)/target        the cargo target directory (override with CARGO_TARGET_DIR)
#   .venv                      this checkout's venv: sees the deps and this checkout's python/ through
#                              .pth files; `_core` is built in place (python/yoco_rs/_core*.so)

SHELL := /bin/bash
PYTHON ?= python3
YOCO_HOME ?= $(HOME)/.cache/yoco-rs
export CARGO_TARGET_DIR ?= $(YOCO_HOME)/target
VENV := .venv
VPY := $(VENV)/bin/python
DEPS_KEY := $(shell $(PYTHON) scripts/deps.py key)
DEPS := $(YOCO_HOME)/deps-$(DEPS_KEY)
RUST_SRC := $(shell find crates -name '*.rs' -o -name Cargo.toml) Cargo.toml pyproject.toml
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: setup serve test test-rust test-python bench clean

setup: $(VENV)/.built

# Third-party deps: installed once per dependency set (the first time takes a few minutes: torch).
$(DEPS)/.ok:
	@echo ">> installing Python dependencies into $(DEPS) (first time only)"
	rm -rf $(DEPS) && $(PYTHON) -m venv $(DEPS)
	$(DEPS)/bin/python -m pip install -q --upgrade pip
	$(DEPS)/bin/python -m pip install -q $$($(PYTHON) scripts/deps.py list)
	touch $@

$(VENV)/.linked: $(DEPS)/.ok
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	$(VPY) scripts/deps.py link $(DEPS)
	touch $@

# The extension module, rebuilt when Rust sources change.
$(VENV)/.built: $(VENV)/.linked $(RUST_SRC)
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(VPY) scripts/deps.py maturin develop --release --quiet --skip-install
	touch $@

serve: setup
	$(VENV)/bin/yoco-serve --host $(HOST) --port $(PORT)

test: setup test-rust test-python

test-rust:
	cargo test --workspace --exclude yoco-py --profile ci

test-python: setup
	$(VPY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(MAKE) -C benches all VPY=$(abspath $(VPY))

clean:
	rm -rf $(VENV) python/yoco_rs/_core*.so
