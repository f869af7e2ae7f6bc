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

# The browser tests' Chromium (Debian's `chromium` package; override to use another).
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM

.PHONY: setup model book book-static test test-quick test-nbval test-portable portable-% test-browser chromium peer bench lab notebooks clean

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
	@$(PY) -m kvlib.smollm2.weights

## book: execute every notebook (cached between builds) and build the HTML book.
## book/assets.py first fetches (npm, pinned, once) the widget manager and MathJax that the
## book serves itself, and writes the configuration to build with (BOOK_JS=cdn: use CDNs).
book: setup model
	$(PY) book/assets.py _build/_config.book.yml
	$(JB) build . --config _build/_config.book.yml $(JB_FLAGS)
	@echo "Open file://$(CURDIR)/_build/html/index.html"

## book-static: build the HTML from the outputs stored in the notebooks (what nbval checked).
book-static: setup
	$(PY) book/assets.py _build/_config.static.yml --static
	$(JB) build . --config _build/_config.static.yml $(JB_FLAGS)

## test: every test: kvlib unit and property tests, the real-model and oracle tests,
## nbval strict on every notebook (as this machine runs it, and as other CPUs' matrix
## kernels round), the student edition, and a warning-free book build in Chromium.
## After nbval, the notebook runs that remain go side by side, one thread each (so another
## thread count than this machine's is tried too): the notebooks with MKL_CBWR=COMPATIBLE
## (a plain SSE2 machine's rounding) in two halves, and the student edition with
## MKL_CBWR=AVX2 (an AVX2-only machine's), which compares every cell but the solutions
## (those the default and the COMPATIBLE runs compare). `make test-portable` runs both
## roundings on every notebook in full. The browser tests come last, alone (a browser
## starved of CPU by the notebooks times out).
test: setup model
	$(PY) -m pytest
	$(MAKE) --no-print-directory test-nbval
	@echo "Side by side, one thread each: nbval with other CPUs' rounding, and the student edition"
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j 3 --output-sync=target \
	  portable-COMPATIBLE-odd portable-COMPATIBLE-even student-and-test STUDENT_CBWR=AVX2
	$(MAKE) --no-print-directory test-browser

## test-browser: build the book (book-static), then check every page in Chromium, offline
## (tests/browser: no request leaves 127.0.0.1, no error, widgets alive, solutions hidden).
test-browser: book-static chromium
	$(PY) -m pytest tests/browser -p no:cacheprovider

## chromium: the browser tests need Chromium; install Debian's package when missing and
## possible (root, apt-get), otherwise say how.
chromium:
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Chromium is not at $(CHROMIUM): installing Debian's chromium package (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    || { echo "error: apt-get install chromium failed" >&2; exit 1; }; \
	  [ -x "$(CHROMIUM)" ] || { echo "error: chromium installed, but not at $(CHROMIUM); set CHROMIUM=/path/to/chromium" >&2; exit 1; }; \
	else \
	  echo "error: the browser tests (tests/browser) need Chromium, and it is not at $(CHROMIUM)." >&2; \
	  echo "  Install it: sudo apt-get install chromium   (Debian; Ubuntu: chromium-browser, or Google Chrome)" >&2; \
	  echo "  or point the tests at one you have: make test CHROMIUM=/path/to/chromium" >&2; \
	  echo "  (\`playwright install\` is not needed: the tests drive the system browser.)" >&2; \
	  exit 1; \
	fi

## test-quick: the fast unit tests only (no real model, no notebooks).
test-quick: setup
	$(PY) -m pytest -m "not slow" -q

NBVAL := -m pytest --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

test-nbval: setup model
	$(PY) $(NBVAL) $(NOTEBOOKS)

## test-portable: nbval on every notebook as other machines run it. MKL_CBWR switches MKL's
## matrix kernels to another code path: AVX2 gives the rounding of an AVX2-only CPU,
## COMPATIBLE that of a plain SSE2 one. Both must pass, as the default run does; they run
## side by side, one thread each (so another thread count than this machine's is tried too).
test-portable: setup model
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j 2 --output-sync=target portable-AVX2 portable-COMPATIBLE

portable-%: setup model
	@echo "nbval with MKL_CBWR=$*, $${OMP_NUM_THREADS:-default} thread(s)"
	MKL_CBWR=$* $(PY) $(NBVAL) -q $(NOTEBOOKS)

# The same, on every other notebook (1st, 3rd, ...; 2nd, 4th, ...): two halves of about
# the same length, to run side by side.
NOTEBOOKS_ODD := $(shell printf '%s\n' $(NOTEBOOKS) | awk 'NR % 2 == 1')
NOTEBOOKS_EVEN := $(shell printf '%s\n' $(NOTEBOOKS) | awk 'NR % 2 == 0')
portable-%-odd: setup model
	@echo "nbval with MKL_CBWR=$*, $${OMP_NUM_THREADS:-default} thread(s): $(notdir $(NOTEBOOKS_ODD))"
	MKL_CBWR=$* $(PY) $(NBVAL) -q $(NOTEBOOKS_ODD)
portable-%-even: setup model
	@echo "nbval with MKL_CBWR=$*, $${OMP_NUM_THREADS:-default} thread(s): $(notdir $(NOTEBOOKS_EVEN))"
	MKL_CBWR=$* $(PY) $(NBVAL) -q $(NOTEBOOKS_EVEN)

## peer: (optional) llama.cpp as the benchmark's peer: builds llama-cpp-python from its PyPI
## sdist with the CPU's own instructions (GGML_NATIVE). It needs cmake and a C++ compiler and
## takes a few minutes once; pip keeps the built wheel. make book and make test do not need it.
PEER_STAMP := $(VENV)/.kvlib-peer
peer: $(PEER_STAMP)
$(PEER_STAMP): requirements-peer.txt $(STAMP)
	@command -v cmake >/dev/null || { echo "error: make peer needs cmake (Debian: apt-get install cmake)" >&2; exit 1; }
	@command -v c++ >/dev/null || { echo "error: make peer needs a C++ compiler (Debian: apt-get install g++)" >&2; exit 1; }
	@echo "building llama-cpp-python from its sdist (a few minutes on 2 cores) ..."
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PY) -m pip install --quiet --no-binary llama-cpp-python -r requirements-peer.txt
	@touch $@

## bench: python -m kvlib.bench on 2 threads (with llama.cpp when make peer has run).
bench: setup model
	$(PY) -m kvlib.bench --threads 2

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

# --- the student edition (scripts/student_edition.py; see chapters/instructors.md) ---
.PHONY: student test-student student-and-test

## student: write the student edition into student/ (solution cells replaced by their stubs,
## solution blocks removed), build it into student/_build/html (stored outputs, no execution)
## and check that no line of any solution reached it.
student: setup
	$(PY) scripts/student_edition.py --out student
	$(JB) build student $(JB_FLAGS)
	$(PY) scripts/student_edition.py --out student --leaks
	@echo "Student edition: $(CURDIR)/student/ (book: file://$(CURDIR)/student/_build/html/index.html)"

## student-and-test: the student edition (make student), then nbval on it (make test-student),
## after the book's build has fetched the offline assets the student book serves too.
student-and-test: book-static
	$(MAKE) --no-print-directory student
	$(MAKE) --no-print-directory test-student

## test-student: nbval on the student edition's notebooks (the stubs' checks, and the cells
## that use a stub, are tagged raises-exception; every other cell is compared as in test-nbval).
## (STUDENT_CBWR=AVX2: with MKL_CBWR=AVX2, another machine's rounding, as make test runs it.)
test-student: setup model
	$(PY) scripts/student_edition.py --out student --quiet
	$(if $(STUDENT_CBWR),MKL_CBWR=$(STUDENT_CBWR) )$(PY) $(NBVAL) student/chapters/*.ipynb
