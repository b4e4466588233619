# Two entry points a newcomer needs: `make demo` (the main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trm demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .
