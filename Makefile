# Two commands for a newcomer: `make demo` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-slow test-browser demo lab bench browser-deps lint clean notebooks-html

# torch first: `pip install torch==2.13.0` takes the CPU build on disk; installing the project
# into an environment without torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian's Chromium for the browser tests (Playwright drives /usr/bin/chromium; never `playwright install`).
browser-deps:
	@if [ ! -x /usr/bin/chromium ]; then \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
	  || { echo "ERROR: could not install chromium (apt-get install chromium); browser tests cannot run" >&2; exit 1; }; \
	fi

# The default suite: unit, notebook and browser tests (slow ones excluded, see test-slow).
# Notebooks run at their fast size (MPO_VIZ_NOTEBOOK_FAST=1: tiny models and runs).
test: venv browser-deps
	$(PY) -m pytest -m "not slow" tests
	MPO_VIZ_NOTEBOOK_FAST=1 $(PY) -m pytest --nbmake -p no:randomly notebooks

# Every notebook executed and rendered to HTML with its outputs, into build/notebooks-html/ (not
# committed). At the committed sizes this trains for real (tens of minutes on 2 cores); `make
# notebooks-html FAST=1` renders the fast size in a few minutes.
NB_HTML := build/notebooks-html
notebooks-html: venv
	mkdir -p $(NB_HTML)
	$(if $(FAST),MPO_VIZ_NOTEBOOK_FAST=1 ,)$(VENV)/bin/jupyter nbconvert --to html --execute \
	  --ExecutePreprocessor.timeout=3600 --output-dir $(NB_HTML) notebooks/*.ipynb
	@echo "rendered: $(NB_HTML)/"

test-slow: venv browser-deps
	$(PY) -m pytest -m slow tests

demo: venv
	$(PY) -m mpo_viz.demo

lab: venv
	$(VENV)/bin/jupyter lab notebooks/

bench: venv
	@for f in benchmarks/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

lint: venv
	$(VENV)/bin/ruff check mpo_viz tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache *.egg-info
