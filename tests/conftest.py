import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from ng_otel.cli.receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[1]
# What the build must never see: an egg-info or build folder from an editable install here
# changes what the wheel (and its entry points) contain.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")


@pytest.fixture
def otlp():
    """A real OTLP receiver (gRPC and HTTP) on 127.0.0.1, fresh for each test."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def ng_otel_dist(tmp_path_factory) -> Path:
    """The sdist and wheel of this working tree, built from a clean copy of it."""
    source = tmp_path_factory.mktemp("source") / "ng_otel"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


@dataclass(frozen=True)
class Installed:
    """A virtual environment with ng_otel installed from the wheel, as a user installs it."""

    path: Path

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment without OTEL_*/NG_OTEL_* (so tests choose them) and
        without the test venv's paths."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_", "PYTHON", "VIRTUAL_ENV"))}
        return {**env, "COLUMNS": "200", **extra}


@pytest.fixture(scope="session")
def installed(ng_otel_dist, tmp_path_factory) -> Installed:
    """ng_otel from its wheel with the demo, no-code and Prometheus extras and
    opentelemetry-distro, in one resolver pass (the contrib packages pin the SDK)."""
    (wheel,) = ng_otel_dist.glob("*.whl")
    path = tmp_path_factory.mktemp("installed") / "venv"
    venv.create(path, with_pip=True)
    # The versions this suite's own environment resolved: the contrib family pins the SDK
    # exactly, and a fresh resolution against the registry can find no consistent set.
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, timeout=120
    )
    constraints = path.parent / "constraints.txt"
    constraints.write_text(frozen.stdout)
    done = subprocess.run(
        [
            str(path / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--constraint",
            str(constraints),
            f"{wheel}[demo,instrument,fastapi,aiohttp,prometheus]",
            "opentelemetry-distro",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Installed(path)


@pytest.fixture(scope="session")
def ng_otel_cli(installed, tmp_path_factory):
    """Run the installed ``ng-otel`` command as a user runs it, from a folder of its own."""
    workdir = tmp_path_factory.mktemp("workdir")

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [installed.bin("ng-otel"), *args],
            capture_output=True,
            text=True,
            env=installed.env(**(env or {})),
            cwd=cwd or workdir,
            timeout=180,
        )

    return run
