# vitscale — the two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## Train the built-in digits ViT on this machine's CPU (or GPU) and print its accuracy.
demo: $(STAMP)
	$(PY) -m vitscale demo

## Run the whole test suite (unit, interop, distributed on 2 CPU processes, integration).
test: $(STAMP)
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check vitscale tests

clean:
	rm -rf $(VENV) runs .pytest_cache
