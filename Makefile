# The README's two commands: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test lint bench api clean real-gym

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The demo needs only the example stack's frameworks; the tests need everything.
$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
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

# Only the real-Gym lane: NeMo Gym 0.7.0 in its cached venv (tools/real-gym.sh venv; built from
# the registry on first use), ng_otel installed there from a freshly built wheel. `make test`
# runs it too, as part of the whole suite.
real-gym: $(STAMP)
	$(BIN)/pytest -q -m real_gym tests/test_real_gym.py

bench: $(STAMP)
	$(BIN)/python bench/run.py

api: $(STAMP)
	$(BIN)/python tools/gen_api.py

clean:
	rm -rf $(VENV) .venv-3.* .venv-lowest build dist *.egg-info ng-otel-demo
