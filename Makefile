# Two entry points a newcomer needs: `make demo` (the main job) and `make test` (the whole suite,
# and the docs: `mkdocs build --strict` fails on a broken link or a page missing from the nav).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test docs lint format bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench,plot,frames,ui]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trm demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m mkdocs build --strict --site-dir site
	$(PY) -m pytest

docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .
