#!/usr/bin/env bash
# Real NeMo Gym, cached outside the checkout, keyed by its version.
#   tools/real-gym.sh wheel   unzipped wheel (its pydantic-only modules import without the rest of Gym)
#   tools/real-gym.sh venv    a Python 3.13 venv with nemo-gym installed (~1.4 GB, ~3 minutes the first time)
#   tools/real-gym.sh install WHEEL   that venv with ng_otel from WHEEL, as docs/gym.md installs it
#   tools/real-gym.sh otel-alone   a copy of that venv with OpenTelemetry's distro and no ng_otel
# Each prints the path it prepared. NG_OTEL_GYM_CACHE moves the cache (default ~/.cache/ng-otel).
set -euo pipefail
version=${NG_OTEL_GYM_VERSION:-0.7.0}
cache=${NG_OTEL_GYM_CACHE:-$HOME/.cache/ng-otel}
mkdir -p "$cache"

case "${1:-}" in
  wheel)
    dir="$cache/wheel-$version"
    if [ ! -f "$dir/.unzipped" ]; then
      rm -rf "$dir" && mkdir -p "$dir"
      # Gym declares Python 3.13.14; the wheel itself is pure Python.
      pip download --quiet --no-deps --only-binary=:all: --python-version 3.13.14 -d "$dir" "nemo-gym==$version" >&2
      python3 -m zipfile -e "$dir"/nemo_gym-"$version"-*.whl "$dir/unzipped"
      touch "$dir/.unzipped"
    fi
    echo "$dir/unzipped"
    ;;
  venv)
    dir="$cache/gym-$version"
    if [ ! -f "$dir/.installed" ]; then
      pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
      python=$(ls -d "$pyenv_root"/versions/3.13.*/bin/python3.13 2>/dev/null | sort -V | tail -n 1 || true)
      [ -n "$python" ] || python=$(command -v python3.13)
      rm -rf "$dir"
      "$python" -m venv "$dir"
      "$dir/bin/pip" install --quiet --upgrade pip >&2
      # It declares 3.13.14 but runs on the 3.13.0 these machines have.
      "$dir/bin/pip" install --quiet --ignore-requires-python "nemo-gym==$version" >&2
      touch "$dir/.installed"
    fi
    echo "$dir"
    ;;
  install)
    wheel=${2:?usage: tools/real-gym.sh install WHEEL}
    wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
    dir=$("$0" venv)
    pip=("$dir/bin/python" -m pip --disable-pip-version-check)
    # docs/gym.md's line: what the no-code path needs, in one resolver pass with the SDK Gym has.
    "${pip[@]}" install --quiet "ng-otel[instrument,fastapi,aiohttp] @ file://$wheel" opentelemetry-exporter-otlp >&2
    # An older lane's distro would configure the SDK first, one OTEL_SERVICE_NAME for every server.
    "${pip[@]}" uninstall --quiet --yes opentelemetry-distro >&2 2>/dev/null || true
    "${pip[@]}" install --quiet --force-reinstall --no-deps "$wheel" >&2  # this wheel, even at the same version
    "${pip[@]}" check >&2
    echo "$dir"
    ;;
  otel-alone)
    # That venv as a user without ng_otel instruments it: OpenTelemetry's distro (its SDK
    # set-up under opentelemetry-instrument) and the FastAPI instrumentation, no ng_otel. A
    # hard-linked copy (pip replaces files, never writes into them), its scripts' shebangs
    # pointed at itself. bench/gym_run.py's floor.
    src=$("$0" venv)
    dir="$cache/gym-$version-otel-alone"
    if [ ! -f "$dir/.installed" ]; then
      rm -rf "$dir"
      cp -al "$src" "$dir"
      rm -f "$dir/.installed"
      grep -l "^#!$src/bin/" "$dir"/bin/* 2>/dev/null | xargs -r sed -i "1s|^#!$src/bin/|#!$dir/bin/|"
      pip=("$dir/bin/python" -m pip --disable-pip-version-check)
      "${pip[@]}" uninstall --quiet --yes ng-otel >&2 2>/dev/null || true
      contrib=$("${pip[@]}" show opentelemetry-instrumentation 2>/dev/null | sed -n 's/^Version: //p')
      sdk=$("${pip[@]}" show opentelemetry-sdk 2>/dev/null | sed -n 's/^Version: //p')
      "${pip[@]}" install --quiet "opentelemetry-distro==${contrib:-0.66b2}" \
        "opentelemetry-instrumentation-fastapi==${contrib:-0.66b2}" "opentelemetry-exporter-otlp==${sdk:-1.45.2}" >&2
      "${pip[@]}" check >&2
      touch "$dir/.installed"
    fi
    echo "$dir"
    ;;
  *)
    echo "usage: tools/real-gym.sh wheel|venv|install WHEEL|otel-alone" >&2
    exit 2
    ;;
esac
