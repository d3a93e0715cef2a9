# Quick start: `make run` then `make test`. Both create .venv if it is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# Keep caches inside the checkout so repeated runs (and CI) reuse prepared data and built ops.
export SCALELAB_CACHE ?= $(CURDIR)/.cache/scalelab

.PHONY: run test test-slow setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, pinned: the CPU build is on disk here; any other resolution pulls a CUDA build.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[all]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/scalelab-train -m experiment=default

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf outputs multirun .pytest_cache
