# Quick start: `make demo` runs the live pipeline on a simulated cluster; `make test` runs the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench clean

$(BIN)/steptail: pyproject.toml parsers/_steady.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/steptail

setup: $(BIN)/steptail

demo: setup
	$(BIN)/steptail demo

# The suite on TEST_WORKERS pytest-xdist workers (most tests wait on the simulated cluster's
# clock, not the CPU); `make test TEST_WORKERS=0` runs it in one process. A bare `pytest` is serial.
TEST_WORKERS ?= 3
test: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) steptail.db steptail-demo .pytest_cache build parsers/_steady.*.so
