# The two promises of the README: `make demo` and `make test` each set everything up and run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
STAMP_LAB := $(VENV)/.installed-lab
STAMP_DOCS := $(VENV)/.installed-docs
# Numba keys its on-disk cache on the defining file only, so a kernel that inlines helpers from a
# sibling module would keep stale machine code after that module changes: key the cache directory
# on every Numba-using source instead.
NUMBA_SOURCES_HASH := $(shell grep -rl --include='*.py' numba workbench | sort | xargs cat | cksum | cut -d' ' -f1)
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba/$(NUMBA_SOURCES_HASH)
export MPLBACKEND ?= Agg
# Bytecode is cached (Python's default), even where the shell turns it off: otherwise every test worker,
# notebook kernel and sweep process compiles its modules again, and pytest rewrites every test module again
export PYTHONDONTWRITEBYTECODE :=

.PHONY: demo test test-all lint bench gpu-check figures paper notebooks lab docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

$(STAMP_RUN): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

# --no-compile: a module's bytecode is written when something first imports it. Compiling all ~7,200 modules
# of the dependencies up front costs ~13 s of CPU; the ~1,500 that the tests import cost ~3 s at first import
$(STAMP_DEV): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	touch $@ $(STAMP_RUN)

# JupyterLab only where a person reads the notebooks: the tests execute them with a kernel and a client
$(STAMP_LAB): $(STAMP_DEV)
	$(BIN)/python -m pip install -q -e '.[dev,notebooks]'
	touch $@

$(STAMP_DOCS): $(STAMP_DEV)
	$(BIN)/python -m pip install -q -e '.[dev,docs]'
	touch $@

demo: $(STAMP_RUN)
	$(BIN)/python -m workbench.sweep --resume   # a second `make demo` reuses the finished points

lint: $(STAMP_DEV)
	$(BIN)/ruff check .

# `make test`: every code path, on every core, in minutes; `make test-all` adds the exhaustive variants
# marked `slow` (all 2^32 fp8 patterns, full-size notebooks and experiments, long random walks)
# --dist loadfile: a test file's tests share one worker, so what a file builds once (its module fixtures,
# compiled kernels, a wheel) is built once. --no-loadscope-reorder: the files run in collection order, where
# tests/conftest.py puts the longest first (xdist would order them by their number of tests)
PYTEST := $(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15
# The Numba kernels are compiled once before the tests start (workbench/build_kernels.py): workers starting
# together would each compile them. The cuda-cpu shim's g++ build, the longer part, runs beside the tests
# instead: a test that needs the library waits for it on the build's lock.
WITH_KERNELS = $(BIN)/python -m workbench.build_kernels shim & $(BIN)/python -m workbench.build_kernels numba &&
# tests/cpu_timed.py prints, under the 15 slowest, the CPU seconds of the whole run (kernel builds, every
# worker and the processes the tests start): `make test` stays within 550 s, five minutes of two cores
CPU_TIMED = $(BIN)/python tests/cpu_timed.py sh -c
test: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(CPU_TIMED) '$(WITH_KERNELS) $(PYTEST) -m "not slow"; status=$$?; wait; exit $$status'

test-all: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(CPU_TIMED) '$(WITH_KERNELS) $(PYTEST); status=$$?; wait; exit $$status'

bench: $(STAMP_DEV)
	$(BIN)/python benchmarks/bench_workload.py
	$(BIN)/python benchmarks/bench_allocators.py
	$(BIN)/python benchmarks/bench_kernels.py --clock cpu
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_compiled_loop.py

# Offline on purpose (a GPU machine may have no network): the interpreter that has cupy runs the
# source tree directly; GPU_PYTHON=.venv/bin/python after `pip install -e '.[gpu,dev]'` also works.
GPU_PYTHON ?= $(PYTHON)
gpu-check:
	PYTHON=$(GPU_PYTHON) benchmarks/gpu_check.sh out/gpu-check

figures: $(STAMP_DEV)
	$(BIN)/python -m workbench.figures

paper: $(STAMP_RUN)
	$(BIN)/python -m workbench.paper

# executes every notebook at full size and stores its outputs (figures, tables) in place
notebooks: $(STAMP_DEV)
	$(BIN)/python -m workbench.notebook notebooks/*.ipynb

# the user docs, the API reference generated from the docstrings and the figure gallery, into build/site;
# --strict: a broken link, anchor or API reference fails the build
docs: $(STAMP_DOCS)
	$(BIN)/mkdocs build --strict

lab: $(STAMP_LAB)
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

clean:
	rm -rf $(VENV) .cache build *.egg-info
