# The README's two commands: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint pythons bench api clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ng-otel demo

lint: $(STAMP)
	$(BIN)/ruff check ng_otel tests bench examples tools
	$(BIN)/ruff format --check ng_otel tests bench examples tools
	$(BIN)/mypy

# Lint and types, the whole suite on the default Python, then the unit suite on every other
# supported Python the machine has (3.10, 3.12, 3.13) and against the lowest dependency
# versions pyproject.toml admits.
test: lint
	$(BIN)/pytest -q
	tools/unit-on-pythons.sh
	tools/lowest-deps.sh

bench: $(STAMP)
	$(BIN)/python bench/run.py

api: $(STAMP)
	$(BIN)/python tools/gen_api.py

clean:
	rm -rf $(VENV) .venv-3.* .venv-lowest build dist *.egg-info ng-otel-demo
