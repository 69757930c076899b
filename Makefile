# The README's two commands: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test real-gym matrix lint bench api clean

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

# Lint, types and the whole suite on this Python: what `make test` promises in minutes. The
# real-Gym lane (real NeMo Gym 0.7.0 in its own cached venv, ~3 minutes to build the first
# time) and the matrix (the unit suite on 3.10/3.12/3.13 and on the lowest dependency versions
# pyproject.toml admits) run on their own, and all three in CI (.ci/run). The suite runs on two
# workers (pytest-xdist), a test file at a time each, in file order, so each file runs whole in
# one process as it would alone (its module fixtures set up once); the wheel the e2e tests
# install is built once for both (tests/conftest.py).
test: lint
	tools/real-gym.sh wheel >/dev/null  # Gym 0.7.0's source, which tests/test_recovery.py reads
	$(BIN)/pytest -q -m "not real_gym" -n 2 --dist loadfile --no-loadscope-reorder

real-gym: $(STAMP)
	$(BIN)/pytest -q -m real_gym tests/test_real_gym.py tests/test_ray.py

matrix: $(STAMP)
	tools/unit-on-pythons.sh
	tools/lowest-deps.sh

# The benchmarks serve as NeMo Gym does (uvicorn on uvloop and httptools): the bench extra,
# resolved with the test extra in one pass. Every figure next to its target (docs/performance.md).
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python bench/run.py

api: $(STAMP)
	$(BIN)/python tools/gen_api.py

clean:
	rm -rf $(VENV) .venv-3.* .venv-lowest build dist *.egg-info ng-otel-demo
