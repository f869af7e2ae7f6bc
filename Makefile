# Two commands for a new user: `make book` and `make test` (see README.md).
# Every target sets up .venv first and is quick when nothing changed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvlib-installed
MODEL_STAMP := $(VENV)/.kvlib-model
JB := $(VENV)/bin/jupyter-book
JB_FLAGS := -W -n --keep-going
NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb))

.PHONY: setup model book book-static test test-quick test-nbval lab notebooks clean

## setup: create .venv and install the pinned requirements plus kvlib itself (once).
setup: $(STAMP)
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

## model: fetch and verify the SmolLM2-135M-Instruct GGUF once (into ~/.cache/kvlib).
model: $(STAMP)
	@$(PY) -m kvlib.weights

## book: execute every notebook (cached between builds) and build the HTML book.
book: setup model
	$(JB) build . $(JB_FLAGS)
	@echo "Open file://$(CURDIR)/_build/html/index.html"

## book-static: build the HTML from the outputs stored in the notebooks (what nbval checked).
book-static: setup
	@mkdir -p _build
	@sed 's/^\(\s*execute_notebooks:\).*/\1 "off"/' _config.yml > _build/_config.static.yml
	$(JB) build . --config _build/_config.static.yml $(JB_FLAGS)

## test: every test: kvlib unit and property tests, the real-model and oracle tests,
## nbval strict on every notebook, and a warning-free book build.
test: setup model
	$(PY) -m pytest
	$(MAKE) --no-print-directory test-nbval
	$(MAKE) --no-print-directory book-static

## test-quick: the fast unit tests only (no real model, no notebooks).
test-quick: setup
	$(PY) -m pytest -m "not slow" -q

test-nbval: setup model
	$(PY) -m pytest --nbval $(NOTEBOOKS) --sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

## lab: JupyterLab on the chapter, with this project's Python.
lab: setup
	$(VENV)/bin/jupyter lab chapters/

## notebooks: (authors) re-execute every notebook in place so the stored outputs are current.
notebooks: setup model
	@for nb in $(NOTEBOOKS); do echo "executing $$nb"; \
	  $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=900 --ExecutePreprocessor.store_widget_state=True $$nb || exit 1; done

clean:
	rm -rf _build
