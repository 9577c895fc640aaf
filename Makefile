# Quick start: `make demo` runs the live pipeline on a simulated cluster; `make test` runs the tests.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup dev demo test quick test-image lint bench clean image

# `make setup` (and `make demo`) install what the product needs, nothing more; the tools of the
# tests and benchmarks (pytest, moto, duckdb, hypothesis, ruff…: the dev extra) come with
# `make test`, `make lint` and `make dev`.
# compileall: an editable install leaves the project's own modules uncompiled, and with
# PYTHONDONTWRITEBYTECODE set (as on CI) every `steptail` process compiled them again (~0.2 s).
$(BIN)/steptail: pyproject.toml parsers/_steady.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	$(BIN)/python -m compileall -q parsers runs storage dashboards collector simcluster steptail
	touch $(BIN)/steptail

$(VENV)/.dev: $(BIN)/steptail
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(VENV)/.dev

setup: $(BIN)/steptail

dev: $(VENV)/.dev

demo: setup
	$(BIN)/steptail demo

# The suite on 3 pytest-xdist workers by default, on a 2-core machine too: its tests wait on the
# simulated cluster's clock about as much as they compute (measured on 2 cores, without the image:
# 28 min and 2,184 s of CPU on 3 workers; 46 min and 2,452 s on 2, which left a core idle).
# `make test TEST_WORKERS=0` runs it serially, in one process.
# TEST_ARGS: more pytest arguments, e.g. `make test TEST_ARGS="-m 'not image'"` (what .ci/run does: the
# image build and run, tests/test_image.py, is its own step there, `make test-image`).
TEST_WORKERS ?= 3
TEST_ARGS ?=
test: dev
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal $(TEST_ARGS)

# `make quick`: the inner loop, a few minutes: the suite without the tests marked `slow` (long
# follow scenarios, chaos seeds, soak, browser, and single tests of 2 s and more: tests/slow_tests.txt)
# and `image`.
quick: dev
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow and not image" $(TEST_ARGS)

# `make test-image`: tests/test_image.py alone (builds deploy/Containerfile, ~6-12 min; root, podman…).
test-image: dev
	$(BIN)/pytest -q -p no:xdist -m image tests/test_image.py $(TEST_ARGS)

# `make image`: deploy/Containerfile built with no registry, as CI builds it (deploy/build-image.sh:
# Debian bases made by mmdebstrap, this machine's kubectl; needs root, podman, buildah, mmdebstrap,
# runc), saved as an OCI archive: `podman load -i build/steptail-image.tar`.
image:
	deploy/build-image.sh --tag localhost/steptail:dev --save build/steptail-image.tar

lint: dev
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) steptail.db steptail-demo .pytest_cache build parsers/_steady.*.so
