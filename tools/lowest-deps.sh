#!/usr/bin/env bash
# The unit suite against the lowest versions pyproject.toml admits for the libraries ng_otel
# adapts to, the OpenTelemetry SDK included (tests/test_sdk_compat.py names each private part
# of it ng_otel reaches), so the declared ranges are ranges the tests prove.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-lowest
if [ ! -f "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ] || [ "$0" -nt "$venv/.installed" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet -e '.[test]' \
    'pydantic==2.10.*' 'typing-extensions==4.12.*' 'orjson==3.10.*' 'fastapi==0.115.*' 'aiohttp==3.10.*' \
    'uvicorn==0.30.*' 'rich==13.*' 'starlette==0.46.*' \
    'opentelemetry-api==1.45.0' 'opentelemetry-sdk==1.45.0' 'opentelemetry-exporter-otlp==1.45.0'
  touch "$venv/.installed"
fi
"$venv/bin/pip" list 2>/dev/null | grep -iE '^(pydantic|typing.extensions|orjson|fastapi|starlette|aiohttp|uvicorn|rich|opentelemetry-sdk) '
"$venv/bin/pytest" -q -m "not e2e" -p no:cacheprovider
