# `make train` and `make test` set everything up on first use (a .venv next to this file).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: train test lint benchmark clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -U pip
	$(PY) -m pip install -e ".[dev]"
	touch $@

train: $(VENV)/.installed
	$(PY) scripts/train.py $(ARGS)

# Two workers: most of the suite's time is subprocesses importing torch, which overlap well.
test: $(VENV)/.installed
	$(PY) -m pytest -n 2 --dist loadgroup $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

benchmark: $(VENV)/.installed
	$(PY) scripts/benchmark.py $(ARGS)

clean:
	rm -rf $(VENV) benchmark-results
