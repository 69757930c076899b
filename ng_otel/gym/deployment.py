"""Which process of a NeMo Gym deployment this is, read from what Gym itself sets.

``gym env start`` runs each server with ``NEMO_GYM_CONFIG_PATH`` (the server's name) and
``NEMO_GYM_CONFIG_DICT`` (the whole resolved config, as OmegaConf YAML), where the server's
block is ``<name>: {<server type>: {<implementation>: {...}}}``. The server type decides the
boundary its failures are seen at. Gym's command-line processes (``gym env start`` holds the
orchestrator and head server, ``gym eval run`` the rollout collection) are named after their
command; Ray's own processes, which inherit the same environment, are told apart by the
program they run.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ng_otel.otel.recorder import FailureRecorder

CONFIG_PATH_VARIABLE: Final = "NEMO_GYM_CONFIG_PATH"
CONFIG_DICT_VARIABLE: Final = "NEMO_GYM_CONFIG_DICT"

# nemo_gym/server_utils.py, _TELEMETRY_SERVER_TYPE_BY_BASE: the server-type directories.
SERVER_TYPE_BOUNDARIES: Final = {
    "responses_api_models": "model",
    "responses_api_agents": "agent",
    "resources_servers": "resources_server",
    "environment_servers": "environment",
}
COLLECTION_COMMANDS: Final = frozenset({("eval", "run"), ("env", "collect"), ("rollout", "collect")})
GYM_PROGRAMS: Final = frozenset({"gym", "nemo-gym", "ng_run", "ng_collect_rollouts"})
RAY_PROCESS_MARK: Final = "_NG_OTEL_IN_RAY"  # set in Ray's processes, inherited by theirs (no setting)
RAY_PACKAGE_PART: Final = f"{os.sep}ray{os.sep}"  # .../site-packages/ray/_private/workers/default_worker.py
# nemo_gym/telemetry/setup.py, is_telemetry_env_enabled: the first of these that is set
# decides, and Gym's telemetry needs nemo-lens to run at all.
GYM_TELEMETRY_SWITCHES: Final = ("NEMO_GYM_OTEL_ENABLED", "NEMO_LENS_ENABLED")
_GYM_TRUTHY: Final = ("1", "true", "yes", "on")
VERIFY_PATHS: Final = ("/verify",)  # a resources server's verify route: its replies are verify outcomes


@dataclass(frozen=True)
class GymProcess:
    service_name: str
    boundary: str | None  # where a failure this process observes is seen; None: none of Gym's


def gym_process(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> GymProcess | None:
    """This process's part in a Gym deployment, or ``None`` outside one (and in Ray's own
    processes, which ``is_ray_process`` names)."""
    env = os.environ if environ is None else environ
    args = sys.argv if argv is None else argv
    server = env.get(CONFIG_PATH_VARIABLE, "").strip()
    if server and not is_ray_process(args):
        return GymProcess(server, server_boundary(server, env.get(CONFIG_DICT_VARIABLE, "")))
    if not args or os.path.basename(args[0]) not in GYM_PROGRAMS:
        return None
    words = tuple(arg for arg in args[1:3] if not arg.startswith(("-", "+")))
    service = "-".join(("gym", *words))
    return GymProcess(service, "collection" if words in COLLECTION_COMMANDS else None)


def is_ray_process(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """A worker, raylet helper or dashboard process Ray started: its program lives in Ray's
    package (Gym starts a Ray cluster, and Ray's processes inherit Gym's environment), or a
    process one of them started (the dashboard's ``multiprocessing`` workers run ``-c``),
    which ``mark_ray_process`` left a mark for."""
    args = sys.argv if argv is None else argv
    env = os.environ if environ is None else environ
    return env.get(RAY_PROCESS_MARK) == "1" or any(RAY_PACKAGE_PART in arg for arg in args[:2])


def mark_ray_process() -> None:
    """Leave the mark for the processes this Ray process starts: they are Ray's too."""
    os.environ[RAY_PROCESS_MARK] = "1"


@functools.lru_cache(maxsize=8)
def server_boundary(server: str, config_yaml: str) -> str | None:
    """The boundary of server ``server`` in Gym's resolved config, read without a YAML
    parser: OmegaConf writes the server's block as ``<server>:`` at the start of a line and
    its type as the next line's key, indented."""
    lines = iter(config_yaml.splitlines())
    for line in lines:
        if line.rstrip() == f"{server}:":
            for inner in lines:
                if inner.strip():
                    key = inner.strip().split(":", 1)[0].strip("'\"")
                    return SERVER_TYPE_BOUNDARIES.get(key) if inner[:1].isspace() else None
            return None
    return None


def gym_telemetry_installs_providers() -> bool:
    """True where NeMo Gym's own telemetry is switched on and can run (nemo-lens is
    installed): it installs this process's providers when the Gym server starts."""
    for name in GYM_TELEMETRY_SWITCHES:
        raw = os.environ.get(name, "").strip().lower()
        if raw:
            return raw in _GYM_TRUTHY and _lens_installed()
    return False


def _lens_installed() -> bool:
    try:
        return importlib.util.find_spec("nemo.lens") is not None
    except (ImportError, ValueError):
        return False


def enable(service_name: str | None = None, **options: Any) -> FailureRecorder | None:
    """``ng_otel.otel.providers.enable`` for a process of a Gym deployment (what
    ``ng_otel.enable`` is): the service is named after the Gym server where the environment
    names none, the providers wait for Gym's own telemetry where it installs them, and Gym's
    rules are registered with the adapters. Takes ``enable``'s arguments."""
    from ng_otel.otel.providers import enable as enable_telemetry

    process = gym_process()
    options.setdefault("default_service_name", process.service_name if process is not None else None)
    options.setdefault("defer_providers", gym_telemetry_installs_providers())
    recorder = enable_telemetry(service_name, **options)
    if recorder is not None:
        install(process)
    return recorder


def enable_for_process() -> FailureRecorder | None:
    """What ``opentelemetry-instrument`` does in each process: ``enable``, except in Ray's
    own processes (unless ``NG_OTEL_RAY_PROCESSES`` asks), which it marks for their children."""
    from ng_otel.otel.providers import ray_processes_wanted

    if is_ray_process() and not ray_processes_wanted():
        mark_ray_process()  # Ray's workers inherit Gym's environment; their telemetry is Ray's
        return None
    return enable()


def uninstall() -> None:
    """Forget Gym's rules (``opentelemetry-instrument``'s uninstrument; tests)."""
    from ng_otel.integrations import hooks

    hooks.reset()


def install_verify_reader() -> None:
    """Gym's rule that holds in every process: a ``/verify`` reply is a verify outcome."""
    from ng_otel.gym.episodes import record_verify_outcome
    from ng_otel.integrations import hooks

    hooks.set_reply_reader(record_verify_outcome, VERIFY_PATHS)


def install(process: GymProcess | None = None) -> GymProcess | None:
    """Register Gym's rules with the adapters for this process (``enable`` does this): a
    ``/verify`` reply is a verify outcome; in a Gym deployment's process, a server's
    escaping exceptions become its events, each failed attempt of Gym's request loop a
    recovered event, and rollout collection's failure rows a ``collection`` event saved with
    the row. Returns the process, ``None`` outside Gym."""
    from ng_otel.gym import failures
    from ng_otel.integrations import hooks

    install_verify_reader()  # any process may serve /verify
    process = process or gym_process()
    if process is None or process.boundary is None:
        return process
    boundary, name = process.boundary, process.service_name
    hooks.set_client_boundary(boundary)
    hooks.set_transport_kind(lambda error: failures.attempt_kind(error, boundary))
    from ng_otel.gym import request_loop

    request_loop.install()  # each call of Gym's request loop a retry loop, its outcome counted once
    if boundary == "collection":
        from ng_otel.gym import collection_hook

        collection_hook.install()
    else:
        hooks.set_escape_hook(lambda error: failures.escaped_failure(error, boundary, name))
    return process
