# Quick start: `make run` then `make test`. Both create .venv if it is missing.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# Keep caches inside the checkout so repeated runs (and CI) reuse prepared data and built ops.
export SCALELAB_CACHE ?= $(CURDIR)/.cache/scalelab

.PHONY: run test test-slow test-slurm slurm-up slurm-down setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "installing torch and scalelab into $(VENV): 1-2 min, once (pip -q prints only its warnings)"
	# torch first, pinned: the CPU build is on disk here; any other resolution pulls a CUDA build.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[all]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/scalelab-train -m experiment=default

# Two pytest-xdist workers, one test file each at a time (a file's module fixtures run once): the
# suite is mostly process start-up and waits, so on 2 cores it takes ~0.8 of the one-worker time
# (measured 566 s vs 720 s with the SLURM cluster up). `TEST_WORKERS=0 make test`: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# The SLURM tests against a real local cluster (Debian packages; root): `make test` runs them too
# whenever the cluster is up, and skips them with the reason when it is not.
test-slurm: $(STAMP) slurm-up
	$(BIN)/python -m pytest -q tests/slurm tests/unit/test_slurm_render.py

slurm-up:
	scripts/slurm_cluster.sh up

slurm-down:
	scripts/slurm_cluster.sh down

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf outputs multirun .pytest_cache
