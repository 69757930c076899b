"""The real NeMo Gym 0.7.0 venv with this checkout's ng_otel, as session fixtures: loaded once
by ``tests/conftest.py`` (``pytest_plugins``) for every real-Gym and Ray test file, so a
session builds and locks the venv once however many files use it."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_until

# -- the Gym venv, with this checkout's ng_otel ------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
GYM_VENV_TIMEOUT = 30 * 60  # building the cached venv from the registry takes ~3 minutes
INSTALL_TIMEOUT = 15 * 60


@dataclass(frozen=True)
class GymVenv:
    """The cached Python 3.13 venv with the real ``nemo-gym`` and ng_otel installed from a
    wheel built from this checkout in this session."""

    path: Path
    wheel: Path  # the unzipped nemo-gym wheel: its sources, for reading

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name


def _run(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def _real_gym(*what: str) -> subprocess.CompletedProcess:
    return _run(["bash", str(REPO / "tools" / "real-gym.sh"), *what], GYM_VENV_TIMEOUT, cwd=REPO)


@pytest.fixture(scope="session")
def gym_venv(ng_otel_dist) -> Iterator[GymVenv]:
    """Real NeMo Gym 0.7.0 (``tools/real-gym.sh venv``) with this checkout's ng_otel installed.

    Skipped only when the registry cannot be reached: if the venv cannot be built but the Gym
    wheel can still be downloaded, the lane fails instead. Every session builds ng_otel as a
    wheel and installs it with what ``opentelemetry-instrument`` needs in one resolver pass
    (so the contrib packages agree with the SDK Gym already has), then reinstalls ng_otel
    itself, so the lane always tests the current code. An exclusive lock on the venv is held
    while installing and a shared one while the session runs, so concurrent sessions never
    test each other's ng_otel.
    """
    made = _real_gym("venv")
    if made.returncode != 0:
        wheel = _real_gym("wheel")
        if wheel.returncode != 0:
            pytest.skip(f"the package registry is unreachable: nemo-gym cannot be downloaded\n{wheel.stderr[-2000:]}")
        pytest.fail(f"tools/real-gym.sh venv failed although the registry answers:\n{made.stderr[-4000:]}")
    venv = Path(made.stdout.strip().splitlines()[-1])
    wheel_dir = _real_gym("wheel")
    if wheel_dir.returncode != 0:
        pytest.fail(f"tools/real-gym.sh wheel failed:\n{wheel_dir.stderr[-4000:]}")

    lock = open(venv / ".ng-otel-lane.lock", "w")  # held (shared) for the whole session
    _lock(lock, fcntl.LOCK_EX)
    try:
        (built_wheel,) = ng_otel_dist.glob("ng_otel-*.whl")  # built from a clean copy of the tree
        # docs/gym.md's install line, the distro taken out, this wheel reinstalled, pip check
        done = _real_gym("install", str(built_wheel))
        if done.returncode != 0:
            pytest.fail(f"tools/real-gym.sh install {built_wheel} failed:\n{done.stderr[-4000:]}")
    finally:
        _lock(lock, fcntl.LOCK_SH)
    try:
        yield GymVenv(venv, Path(wheel_dir.stdout.strip().splitlines()[-1]))
    finally:
        lock.close()


def _lock(handle, mode: int, timeout: float = INSTALL_TIMEOUT) -> None:
    def taken() -> bool:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    wait_until(taken, timeout, f"{handle.name}, which another session holds")


@pytest.fixture(scope="session")
def gym_env_base() -> dict[str, str]:
    """The environment every real-Gym process starts from: this one without anything that
    would point it at the checkout or at another venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_", "NEMO_GYM_"))}
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(key, None)
    return env
