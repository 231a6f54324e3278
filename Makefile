# Two commands do all set-up on a fresh machine:
#   make demo   a small real scaling study on local CPU processes, ending in an HTML dashboard
#   make test   the test suite
# TORCH can be overridden by users who bring their own CUDA build, e.g. TORCH='torch==2.13.0'.
VENV    ?= .venv
PY      := $(VENV)/bin/python
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup system-deps demo test test-fast lint imports clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch on this kind of machine; pyproject declares the range users may bring.
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev,hf]'
	touch $@

# Debian packages the slow tests use (headless Chromium, Slurm); skipped with a note when not root.
system-deps:
	bash scripts/install-system-deps.sh

demo: setup
	$(VENV)/bin/workbench sweep experiments/sweeps/quickstart.yaml

test: setup system-deps
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# The package's floors (import-linter contracts in pyproject.toml; README "Layout").
imports: setup
	$(VENV)/bin/lint-imports --no-cache

lint: imports
	$(VENV)/bin/ruff check workbench tests
	$(VENV)/bin/mypy workbench

clean:
	rm -rf $(VENV) .pytest_cache
