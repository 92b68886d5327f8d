# Two entry points, both doing all set-up on a fresh machine:
#   make run   install, then serve on the embedded defaults (bundled model, in-process store)
#   make test  install with the dev and multilingual extras, then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install run test lint bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,multilingual]"
	$(PY) -m pip install --quiet --no-deps "resemblyzer==0.1.4"  # see pyproject.toml
	touch $@

run: install
	$(PY) -m server

test: install
	$(PY) -m pytest

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy
