#!/usr/bin/env bash
# The unit suite (everything not marked e2e) on each other supported Python the machine has
# (3.10, 3.12, 3.13: on PATH or under pyenv). The full suite runs on the default python3.
set -euo pipefail
cd "$(dirname "$0")/.."
pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
ran=0
for version in 3.10 3.12 3.13; do
  # pyenv's own install first: its shims on PATH exist even where the version is not active.
  python=$(ls -d "$pyenv_root"/versions/"$version".*/bin/python"$version" 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$python" ] && "python$version" --version >/dev/null 2>&1; then
    python=$(command -v "python$version")
  fi
  if [ -z "$python" ]; then
    echo "unit suite on Python $version: skipped (not installed)"
    continue
  fi
  venv=".venv-$version"
  if [ ! -f "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ]; then
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet -e '.[test]'
    touch "$venv/.installed"
  fi
  echo "unit suite on $("$venv/bin/python" --version)"
  "$venv/bin/pytest" -q -m "not e2e" -p no:cacheprovider
  ran=$((ran + 1))
done
echo "unit suite ran on $ran other Python version(s)"
