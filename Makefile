# `make train` and `make test` set everything up on first use (a .venv next to this file).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: train test lint benchmark clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e ".[dev]"
	touch $@

train: $(VENV)/.installed
	$(PY) scripts/train.py $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

benchmark: $(VENV)/.installed
	$(PY) scripts/benchmark.py $(ARGS)

clean:
	rm -rf $(VENV) benchmark-results
