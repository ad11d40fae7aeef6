# vitscale — the two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-quick test-torch lint install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## Train the built-in digits ViT on this machine's CPU (or GPU) and print its accuracy.
demo: $(STAMP)
	$(PY) -m vitscale demo

## Run the whole test suite (unit, interop, distributed on 2 CPU processes, integration) on two
## pytest-xdist workers, one per core of the 2-core dev machine (every test writes under its own tmp_path
## and picks free ports, so the workers never meet). Work stealing: a worker that runs out of tests takes
## the queued ones of the other, so no long test waits behind another while a core is idle. One intra-op
## thread per process (OMP_NUM_THREADS=1): two workers on two cores, not four threads.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist worksteal tests

## The unit tests without the slow and the multi-process ones, for the edit-test loop (about 70 s
## on 2 cores: three workers, as a unit test that waits leaves its core to the others); make test
## before a commit (docs/development.md says which to run when).
test-quick: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -n 3 --dist worksteal -m "not slow and not multiprocess" tests/unit

## The test suite on another torch release, in its own venv: make test-torch TORCH=2.11.0 TORCHVISION=0.26.0
## (2.11 is the GPU image's torch, 2.6 the oldest supported: TORCH=2.6.0 TORCHVISION=0.21.0 TORCHAO=0.10.0,
## as the newest torchao no longer imports on torch 2.6).
TORCH ?= 2.11.0
TORCHVISION ?= 0.26.0
TORCHAO ?=
test-torch:
	test -x .venv-torch$(TORCH)/bin/python || $(PYTHON) -m venv .venv-torch$(TORCH)
	.venv-torch$(TORCH)/bin/python -m pip install --quiet torch==$(TORCH) torchvision==$(TORCHVISION) -e ".[dev]" $(if $(TORCHAO),torchao==$(TORCHAO))
	OMP_NUM_THREADS=1 .venv-torch$(TORCH)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal tests

lint: $(STAMP)
	$(VENV)/bin/ruff check vitscale tests

clean:
	rm -rf $(VENV) .venv-torch* runs .pytest_cache
