# The two promises of the README: `make demo` and `make test` each set everything up and run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba
export MPLBACKEND ?= Agg

.PHONY: demo test lint bench figures lab clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

$(STAMP_RUN): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(STAMP_DEV): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/python -m workbench.workload describe sharegpt-like --num-requests 1000 --rate 2

lint: $(STAMP_DEV)
	$(BIN)/ruff check .

test: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: $(STAMP_DEV)
	@echo "not yet: benchmarks land with the allocator, kernel and engine issues"

figures: $(STAMP_DEV)
	@echo "not yet: figures land with the sweep issue"

lab: $(STAMP_DEV)
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf $(VENV) .cache build *.egg-info
