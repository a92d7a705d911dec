# One command sets up and runs the demo; one sets up and runs the tests.
# PY: the first Python present among 3.11, 3.13, 3.12 (python3.X on PATH, else pyenv's);
# e.g. `make test PY=python3.13 VENV=.venv313` for another one (a venv per Python).
PY ?= $(shell .ci/find-python 3.11 3.13 3.12)
# what runs for a PY given by name: `PY=python3.13` under pyenv is a shim that refuses a version
# that is not the active one, so a `pythonX.Y` that does not run is pyenv's install of X.Y
# (.ci/resolve-python; the same for SKYRL_PY and VERL_PY)
resolve = $(shell .ci/resolve-python '$(1)')
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0
# bytecode is cached (__pycache__, ignored by git): with PYTHONDONTWRITEBYTECODE set, every test
# process, Gym server and driver the suite starts compiles the package from source again (~25 %
# more CPU an import here), and pytest rewrites every test module's asserts again per worker
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test test-fast test-lowest setup-skyrl test-skyrl setup-verl test-verl lint docs bench bench-scale bench-chaos bench-compare clean

$(STAMP): pyproject.toml
	@test -n "$(PY)" || { echo "no Python 3.11-3.13 found: pass PY=..." >&2; exit 1; }
	$(call resolve,$(PY)) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,examples]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/lost_replies.py

# The suite waits on servers and Ray far more than it computes, so it runs in TEST_WORKERS
# processes (pytest-xdist), a test file at a time per process: a module's fixtures (its Gym
# server) and each process's Ray session are started once, as in a serial run. Tests marked
# `serial` (they need the machine to themselves) run before that, in one process. TEST_WORKERS=0
# runs everything in this process, as before. A file needs nothing to join: new files run in
# parallel by default.
TEST_WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest -q
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# both passes always run, the parallel one last (its closing line counts the most tests); the
# first failure's exit code is make's. The serial pass collects only the files that mark a test
# `serial` (collecting the whole suite costs a minute at load) and is skipped when none does.
SERIAL_FILES = $(shell grep -rl 'mark\.serial' tests --include='test_*.py')
define two_passes
	@rc=0; \
	if [ -n "$(SERIAL_FILES)" ]; then \
	  $(PYTEST) -p no:xdist -m "$(1)serial" $(SERIAL_FILES) || { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	fi; \
	$(PYTEST) $(XDIST) -m "$(1)not serial" tests || { r=$$?; [ $$rc != 0 ] || rc=$$r; }; \
	exit $$rc
endef

test: $(STAMP)
	$(call two_passes,)

# the edit loop: everything but the tests marked slow (the whole suite stays `make test`)
test-fast: $(STAMP)
	$(call two_passes,not slow and )

# ruff over the code and its tests, benchmarks and examples; mypy over the package (settings and
# the files mypy checks: pyproject.toml)
LINTED := rl_gym_actors tests benchmarks examples adapter_tests docs
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

# the API reference, generated from the docstrings with pdoc into build/api (open
# build/api/index.html; docs/build_api.py resolves the package's lazily loaded names for it); CI
# builds it, so a docstring or an import that breaks it fails there
API_MODULES := rl_gym_actors rl_gym_actors.orchestrator rl_gym_actors.config rl_gym_actors.errors \
  rl_gym_actors.failures rl_gym_actors.outcome rl_gym_actors.protocol rl_gym_actors.checkpoint_part \
  rl_gym_actors.core.checkpoint_report rl_gym_actors.local_gym rl_gym_actors.metrics \
  rl_gym_actors.snapshot rl_gym_actors.gym.agent_checkpoint.client rl_gym_actors.gym.v2.client \
  rl_gym_actors.integrations.nemo_rl rl_gym_actors.testing \
  '!rl_gym_actors.testing.verl_direct'
# (verl_direct is verl's agent loop registered at import: it needs the [verl] extra, which the
# main venv does not have; pdoc's `!module` leaves it out)
docs: $(STAMP)
	rm -rf build/api
	$(BIN)/python docs/build_api.py --no-search -o build/api $(API_MODULES)
	@test -f build/api/rl_gym_actors/orchestrator.html || { echo "docs: no page for the orchestrator" >&2; exit 1; }
	@grep -q 'id="Orchestrator-view-source"' build/api/rl_gym_actors.html || { echo "docs: the package page lacks its lazily loaded names (docs/build_api.py)" >&2; exit 1; }
	@echo "API reference: build/api/index.html"

# every dependency at the floor pyproject.toml allows (uv's lowest-direct resolution, in a venv
# of its own), then the fast tests: the floors are versions that were tried, not guesses
LOWEST ?= .venv-lowest
test-lowest:
	@test -n "$(PY)" || { echo "no Python 3.11-3.13 found: pass PY=..." >&2; exit 1; }
	rm -rf $(LOWEST)
	$(call resolve,$(PY)) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install -q uv
	$(LOWEST)/bin/uv pip install -q --python $(LOWEST)/bin/python --resolution lowest-direct -e '.[dev,examples]'
	$(LOWEST)/bin/uv pip freeze --python $(LOWEST)/bin/python | grep -iE '^(ray|pydantic|tenacity|fastapi|uvicorn|aiohttp|prometheus.client|httptools|uvloop|pytest|pytest.asyncio|pytest.xdist|hypothesis|numpy|psutil)=='
	$(LOWEST)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider tests

# The SkyRL adapter against the real skyrl (pinned by the skyrl extra), in a venv of its own on
# Python 3.13 or 3.12 (skyrl needs >= 3.12 and pins its own Ray): adapter_tests/skyrl, kept out
# of tests/ so the main suites never collect them. A missing skyrl fails them; nothing skips.
SKYRL_PY ?= $(shell .ci/find-python 3.13 3.12)
SKYRL_VENV ?= .venv-skyrl
SKYRL_STAMP := $(SKYRL_VENV)/.installed

$(SKYRL_STAMP): pyproject.toml
	@test -n "$(SKYRL_PY)" || { echo "no Python 3.12-3.13 found: pass SKYRL_PY=..." >&2; exit 1; }
	$(call resolve,$(SKYRL_PY)) -m venv $(SKYRL_VENV)
	$(SKYRL_VENV)/bin/pip install -q --upgrade pip
	$(SKYRL_VENV)/bin/pip install -q -e '.[dev,skyrl]'
	touch $(SKYRL_STAMP)

# the venv alone (for the README's CPU run of SkyRL's trainers, or the benchmark)
setup-skyrl: $(SKYRL_STAMP)

test-skyrl: $(SKYRL_STAMP)
	$(SKYRL_VENV)/bin/python -m pytest -q -p no:cacheprovider adapter_tests/skyrl

# the verl adapter against the real verl (pinned by the [verl] extra) on CPU, in a venv of its own
# (verl needs Python < 3.13): torch's CPU build first (pip here finds torch 2.13.0+cpu), so that
# nothing pulls a CUDA build, then the project with its dev and verl extras; then the adapter
# tests, which live outside tests/ so the main suites never collect them (~2-10 min install).
# VERL_TORCH: pip's words for torch (a requirement, then options). `torch==2.13.0` is the CPU
# build only where pip also finds `2.13.0+cpu` (here: it sorts above the plain 2.13.0); from PyPI
# alone, on Linux, it is the CUDA build (GBs more). PyTorch's CPU index:
# make test-verl VERL_TORCH='torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu'
VERL_PY ?= $(shell .ci/find-python 3.11 3.12)
VERL_VENV ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
VERL_TORCH ?= torch==2.13.0
$(VERL_STAMP): pyproject.toml
	@test -n "$(VERL_PY)" || { echo "no Python 3.11-3.12 found: pass VERL_PY=..." >&2; exit 1; }
	$(call resolve,$(VERL_PY)) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q --upgrade pip
	$(VERL_VENV)/bin/pip install -q $(VERL_TORCH)
	$(VERL_VENV)/bin/pip install -q -e '.[dev,verl]'
	touch $(VERL_STAMP)

# the venv alone (for the README's CPU run of verl's trainer, or the benchmark)
setup-verl: $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider adapter_tests/verl

# the bench extra (matplotlib, py-spy), installed once per venv (again when pyproject.toml changes)
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	touch $(BENCH_STAMP)

# quick mode of every benchmark, regenerating benchmarks/RESULTS.md (under 8 minutes when quiet)
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run_all.py --quick

# benchmarks/scale.py alone (N raylets, 16 durable Gym servers, big checkpoints; ~3 minutes
# quick), kept out of `make bench` to hold that under 8 minutes; RESULTS.md regenerated
bench-scale: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run_all.py --quick --only scale

# benchmarks/chaos.py (one fault per row, sixteen faults: 5-10 minutes quick) and admission.py
# (how long a checkpoint closes Gym with long episodes in flight, each protocol: ~2 minutes),
# kept out of `make bench` for the same reason; RESULTS.md regenerated
bench-chaos: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run_all.py --quick --only chaos admission fault_campaign

# the same, plus the "before" column: the benchmarks run again against commit e581378
bench-compare: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run_all.py --quick --before e581378

clean:
	rm -rf $(VENV) $(LOWEST) $(SKYRL_VENV) $(VERL_VENV) build *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
