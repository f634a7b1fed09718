# Two commands for a newcomer: `make demo` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv venv-verl test test-verl test-slow demo lab bench experiment-smoke browser-deps lint format clean notebooks-html dist

# The verl environment (tests/integrations): pins in VERL_REQ; rebuilt only when they change
# (.installed holds their hash), mpo_viz reinstalled (editable, no deps) when pyproject.toml changes.
VERL_VENV := .venv-verl
VPY       := $(VERL_VENV)/bin/python
VERL_REQ  := tests/integrations/requirements-verl.txt

# torch first: `pip install torch==2.13.0` takes the CPU build on disk; installing the project
# into an environment without torch would pull a multi-GB CUDA build. The gem and textarena extras
# are installed so that their adapters' tests (tests/envs/test_gem.py, test_textarena.py) run.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev,gem,textarena]'
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
# tests/integrations needs verl and runs in its own environment (`make test-verl`); where verl is
# missing tests/conftest.py leaves it out and the run's header says so.
# Notebooks run at their fast size (MPO_VIZ_NOTEBOOK_FAST=1: tiny models and runs).
test: venv browser-deps
	$(PY) -m pytest -m "not slow" tests
	MPO_VIZ_NOTEBOOK_FAST=1 $(PY) -m pytest --nbmake -p no:randomly notebooks

# Every notebook executed and rendered to HTML with its outputs, into build/notebooks-html/ (not
# committed). At the committed sizes this trains for real (tens of minutes on 2 cores); `make
# notebooks-html FAST=1` renders the fast size in a few minutes. PLOTLY_RENDERER adds each plotly
# figure's HTML (plotly.js embedded) beside its JupyterLab mimetype, so the static page shows the
# figures; the interactive widgets load their manager from unpkg.com when the page is opened.
NB_HTML := build/notebooks-html
notebooks-html: venv
	mkdir -p $(NB_HTML)
	$(if $(FAST),MPO_VIZ_NOTEBOOK_FAST=1 ,)PLOTLY_RENDERER=plotly_mimetype+notebook $(VENV)/bin/jupyter nbconvert --to html --execute \
	  --ExecutePreprocessor.timeout=3600 --output-dir $(NB_HTML) notebooks/*.ipynb
	@echo "rendered: $(NB_HTML)/"

venv-verl:
	@key=$$(sha256sum $(VERL_REQ) | cut -c1-16); \
	if [ "$$(cat $(VERL_VENV)/.installed 2>/dev/null)" != "$$key" ]; then \
	  echo "building $(VERL_VENV) (pins $$key)"; \
	  rm -rf $(VERL_VENV) && $(PYTHON) -m venv $(VERL_VENV) && \
	  $(VPY) -m pip install -q --upgrade pip && \
	  $(VPY) -m pip install -q torch==2.13.0 && \
	  $(VPY) -m pip install -q --no-deps $$(grep '^verl==' $(VERL_REQ)) && \
	  grep -v '^verl==' $(VERL_REQ) > $(VERL_VENV)/requirements.txt && \
	  $(VPY) -m pip install -q -r $(VERL_VENV)/requirements.txt && \
	  rm -f $(VERL_VENV)/.installed-pkg && echo $$key > $(VERL_VENV)/.installed \
	  || { echo "ERROR: could not build $(VERL_VENV) from $(VERL_REQ)" >&2; exit 1; }; \
	fi; \
	pkey=$$(sha256sum pyproject.toml | cut -c1-16); \
	if [ "$$(cat $(VERL_VENV)/.installed-pkg 2>/dev/null)" != "$$pkey" ]; then \
	  $(VPY) -m pip install -q --no-deps -e . && echo $$pkey > $(VERL_VENV)/.installed-pkg; \
	fi

# The plugin against verl 0.9.1's own functions, on CPU (tests/integrations only).
test-verl: venv-verl
	$(VPY) -m pytest -p no:cacheprovider --confcutdir=tests/integrations tests/integrations

test-slow: venv browser-deps
	$(PY) -m pytest -m slow tests

demo: venv
	$(PY) -m mpo_viz.demo

# Jupyter refuses to start as root without --allow-root (containers often run as root).
USER_ID ?= $(shell id -u)
lab: venv
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(USER_ID)),--allow-root ,)notebooks/

# The speed benchmarks at their smoke size (`--quick`, a few minutes in all): each prints its table.
# A speed verdict needs the full size (each script's docstring says how). notebooks.py and
# pretrained_loop.py are long runs, and the replication grids live in experiments/.
BENCH_QUICK := advantages whiten io losses fit_critic rollout truth report widgets train scale envs
bench: venv
	@for b in $(BENCH_QUICK); do echo "== benchmarks/$$b.py --quick"; $(PY) benchmarks/$$b.py --quick || exit 1; done

# The replication runner and the E5 runner end to end at their tiny sizes (a few minutes: nothing learns), into build/
experiment-smoke: venv
	rm -rf build/experiment-smoke
	$(PY) -m experiments.replication --size tiny --out build/experiment-smoke/out --archive build/experiment-smoke/archive
	$(PY) -m experiments.within_turn --quick --out build/experiment-smoke/e5 --archive build/experiment-smoke/e5/records

# A wheel of the package in dist/ (no dependencies bundled), for machines that install it without a clone
# (docs/verl.md); built offline from this checkout with the venv's setuptools.
dist: venv
	$(PY) -m pip wheel --no-deps --no-build-isolation -w dist .
	@ls dist/*.whl

# ruff (style, imports, complexity; the one format) and mypy (types at a basic level, settings in pyproject.toml)
lint: venv
	$(VENV)/bin/ruff check mpo_viz tests benchmarks experiments notebooks
	$(VENV)/bin/ruff format --check mpo_viz tests benchmarks experiments notebooks
	$(VENV)/bin/mypy

# the one code style (ruff format, settings in pyproject.toml); make lint checks it
format: venv
	$(VENV)/bin/ruff format mpo_viz tests benchmarks experiments notebooks

clean:
	rm -rf $(VENV) $(VERL_VENV) .pytest_cache .hypothesis .ruff_cache *.egg-info
