# `make train` and `make test` set everything up on first use (a .venv next to this file).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -c constraints.txt
ARGS ?=

.PHONY: train test test-fast lint benchmark mutation-check mutation-diff figures clean

# What training needs; the test tools come with `make test` (in one pip call: one resolve, not two).
INSTALL = $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -U pip && $(PY) scripts/install_torch.py && $(PIP) -e

$(VENV)/.installed: pyproject.toml constraints.txt scripts/install_torch.py
	$(INSTALL) .
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt scripts/install_torch.py
	$(INSTALL) ".[dev]"
	touch $(VENV)/.installed $@

train: $(VENV)/.installed
	$(PY) scripts/train.py $(ARGS)

# Two workers: most of the suite's time is subprocesses importing torch, which overlap well.
test: $(VENV)/.installed-dev
	$(PY) -m pytest -n 2 --dist loadgroup $(ARGS)

# The in-process checks and one real run of each script: about 3 minutes on 2 cores.
test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -n 2 --dist loadgroup -m "not slow" $(ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture

benchmark: $(VENV)/.installed
	$(PY) scripts/benchmark.py $(ARGS)

# Each known bug made in a copy of the template, and the tests that must catch it run there.
mutation-check: $(VENV)/.installed-dev
	$(PY) scripts/mutation_check.py $(ARGS)

# mutmut over the functions changed since BASE (a commit; default HEAD: the changes not yet committed), with the
# tests that reach them: the score and each survivor. mutmut is not a dependency: installed here on first use.
BASE ?= HEAD
mutation-diff: $(VENV)/.installed-dev
	$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install -q mutmut==3.8.1
	$(PY) scripts/mutation_diff.py --base $(BASE) $(ARGS)

# The default run's output and the CPU benchmark tables, as docs/figures.md quotes them.
figures: $(VENV)/.installed
	bash scripts/figures.sh

clean:
	rm -rf $(VENV) benchmark-results
