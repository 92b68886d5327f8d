# Two entry points, both doing all set-up on a fresh machine:
#   make run   install, then serve on the embedded defaults (bundled model, in-process store)
#   make test  install with the dev and multilingual extras, then run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install sandbox run test lint bench

install: $(VENV)/.installed sandbox

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,multilingual]"
	$(PY) -m pip install --quiet --no-deps "resemblyzer==0.1.4"  # see pyproject.toml
	$(PY) -m pip install --quiet --no-deps "pipecat-ai==1.14.0"  # the turn model; pyproject.toml
	touch $@

# bubblewrap confines the upload decoder (docs/operations.md); without it the server decodes
# only loopback clients' uploads. Installed here when we can (Debian, as root), else we say how.
sandbox:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing bubblewrap, the upload decoder's sandbox"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null \
	  || echo "could not install bubblewrap: run apt-get update && apt-get install bubblewrap"; \
	else \
	  echo "bubblewrap (the upload decoder's sandbox) is missing: sudo apt-get install bubblewrap" \
	    "(Fedora: sudo dnf install bubblewrap); until then only loopback clients' uploads are decoded"; \
	fi

run: install
	$(PY) -m server

# Two workers by default, a test file per worker at a time (see pyproject.toml);
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
