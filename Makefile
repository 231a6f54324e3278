# Two commands do all set-up on a fresh machine:
#   make demo   a small real scaling study on local CPU processes, ending in an HTML dashboard
#   make test   the test suite
# TORCH can be overridden by users who bring their own CUDA build, e.g. TORCH='torch==2.13.0'.
VENV    ?= .venv
PY      := $(VENV)/bin/python
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup system-deps demo test test-fast test-profile lint imports clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch on this kind of machine; pyproject declares the range users may bring.
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev,hf,lightning]'
	# jsonschema (under nbformat, so papermill and plotly's FigureWidget) imports rfc3987-syntax
	# where it is installed, which builds 38 IRI parsers on import: 2 s in every process that
	# imports nbformat, a Dashboard's first draw among them. Nothing here validates IRIs.
	$(PY) -m pip uninstall --quiet --yes rfc3987-syntax
	# Byte-code for the package once: every rank, kernel and CLI process reads it instead of
	# compiling the sources again (where PYTHONDONTWRITEBYTECODE keeps them from caching it).
	$(PY) -m compileall -q workbench tests benchmarks examples >/dev/null
	touch $@

# Debian packages the slow tests use (headless Chromium, Slurm); skipped with a note when not root.
system-deps:
	bash scripts/install-system-deps.sh

demo: setup
	$(VENV)/bin/workbench sweep experiments/sweeps/quickstart.yaml

# The suite in four lanes (tests/lanes.py): the slow tests that wait beside the busy ones, then the
# timing tests; the tests that start no process beside both, idle-class. `pytest`: one process.
test: setup system-deps
	$(PY) -m tests.lanes $(PYTEST_ARGS)

# The suite with its 30 slowest tests listed at the end (tests/README.md keeps that list), and
# the cores each test kept busy in test-cores.tsv (tests/cores_busy.py): a slow test with few
# cores busy is waiting.
test-profile: setup system-deps
	rm -f test-cores.tsv
	WORKBENCH_TEST_CORES=$(CURDIR)/test-cores.tsv $(PY) -m pytest --durations=30 $(PYTEST_ARGS)
	sort -rn test-cores.tsv | head -30

test-fast: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# The package's floors (import-linter contracts in pyproject.toml; docs/layout.md).
imports: setup
	$(VENV)/bin/lint-imports --no-cache

lint: imports
	$(VENV)/bin/ruff check workbench tests
	$(VENV)/bin/mypy workbench

clean:
	rm -rf $(VENV) .pytest_cache
