import asyncio
import contextlib
import fcntl
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ng_otel import NgFailureEvent
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


def user_environment(**extra: str) -> dict[str, str]:
    """This process's environment as the command's tests run it: without OTEL_*/NG_OTEL_* (so
    each test chooses them), 200 columns wide (rich wraps there, and tests read whole lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_"))}
    return {**env, "COLUMNS": "200", **extra}


@dataclass(frozen=True)
class Installed:
    """A virtual environment with ng_otel installed from the wheel, as a user installs it."""

    path: Path

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment without OTEL_*/NG_OTEL_* (so tests choose them) and
        without the test venv's paths."""
        env = {k: v for k, v in user_environment().items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        return {**env, **extra}


# == The wheel, and the venvs installed from it, prepared beside the tests ======================
# Building the sdist and wheel and installing the wheel into fresh venvs takes ~40 s, nearly all
# of it in processes of their own (build, pip). As soon as collection shows a test that needs
# them, a thread of the session starts them, so they run beside the tests in this process rather
# than before the first test that needs them, and each fixture waits for its own step only. A
# step runs once a run, under its lock, in a folder every xdist worker of the run shares (`make
# test` runs `pytest -n 2 --dist loadfile`): whoever takes a step's lock first does it (the thread, or a fixture
# asking first) and writes what it did; whoever takes it after reads that. A step cut short (the
# session ending first) leaves nothing written, and the next to ask does it again from the start.

BUILD_LOG = "build.log"  # beside the dist: what its build printed
_STEPS = ("dist", "installed", "plain")  # in this order: each install needs the dist
_STEPS_OF = {"ng_otel_dist": {"dist"}, "installed": {"dist", "installed"}, "plain_wheel_venv": {"dist", "plain"}}
_STOP = threading.Event()  # set as the session ends: the thread gives up its step
_RUNNING: set[subprocess.Popen] = set()  # the steps' processes running now
_STARTING = threading.Lock()
_PREPARING = pytest.StashKey[threading.Thread]()
_ENVIRON: dict = {}  # the environment and folder the session started in, for the steps' processes


class _Stopped(Exception):
    """The session ended before the step was done."""


def _shared_folder(config: pytest.Config) -> Path:
    """This run's folder for the built wheel and its venvs: shared by the xdist workers of one
    run (their base temporary folders are the run's own, side by side), this session's own
    otherwise."""
    base = config._tmp_path_factory.getbasetemp()  # what the tmp_path_factory fixture gives
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ng-otel-wheel"
    folder.mkdir(exist_ok=True)
    return folder


def _run(command: list[str], timeout: float) -> dict:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)``, in a process
    group of its own that the session's end can kill, with the environment and folder the
    session started in (not what a test running meanwhile set)."""
    with _STARTING:  # so the session's end either sees this process or stops the step first
        if _STOP.is_set():
            raise _Stopped
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_ENVIRON.get("folder"),
            env=_ENVIRON.get("environ"),
            start_new_session=True,
        )
        _RUNNING.add(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # its timeout, as subprocess.run has it, or Ctrl-C: never left running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    finally:
        _RUNNING.discard(process)
    if _STOP.is_set():
        raise _Stopped
    return {"returncode": process.returncode, "stdout": stdout, "stderr": stderr}


def _venv(path: Path) -> None:
    """``venv.create(path, with_pip=True)``, as a process."""
    made = _run([sys.executable, "-m", "venv", str(path)], 300)
    if made["returncode"] != 0:
        raise RuntimeError(f"python -m venv {path} failed: {made['stderr'][-2000:]}")


def _constraints(path: Path) -> Path:
    """The versions this suite's own environment resolved: the contrib family pins the SDK
    exactly, and a fresh resolution against the registry can find no consistent set."""
    frozen = _run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], 120)
    path.write_text(frozen["stdout"])
    return path


def _build(folder: Path) -> dict:
    """The sdist and wheel of this working tree, built from a clean copy of it."""
    source, out = folder / "source" / "ng_otel", folder / "dist"
    for left in (source.parent, out):
        shutil.rmtree(left, ignore_errors=True)
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    built = _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], 600)
    out.mkdir(parents=True, exist_ok=True)
    (out / BUILD_LOG).write_text(built["stdout"] + built["stderr"])  # what a user's build prints
    return {**built, "path": str(out)}


def _wheel(folder: Path) -> Path:
    (wheel,) = Path(_step(folder, "dist")["path"]).glob("*.whl")
    return wheel


def _install_all(folder: Path) -> dict:
    """ng_otel from its wheel with the demo, no-code, Prometheus and report extras and
    opentelemetry-distro, in one resolver pass (the contrib packages pin the SDK), in a fresh venv."""
    wheel, path = _wheel(folder), folder / "installed" / "venv"
    shutil.rmtree(path.parent, ignore_errors=True)
    _venv(path)
    constraints = _constraints(path.parent / "constraints.txt")
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", "--constraint", str(constraints)]
    extras = "[demo,instrument,fastapi,aiohttp,prometheus,report]"
    return {**_run([*pip, f"{wheel}{extras}", "opentelemetry-distro"], 900), "path": str(path)}


def _install_plain(folder: Path) -> dict:
    """The wheel alone, without extras, in a clean venv of its own, as ``pip install`` has it."""
    wheel, path = _wheel(folder), folder / "plain" / "clean"
    shutil.rmtree(path.parent, ignore_errors=True)
    _venv(path)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    return {**_run([*pip, str(wheel)], 600), "path": str(path)}


_DO = {"dist": _build, "installed": _install_all, "plain": _install_plain}


def _step(folder: Path, name: str, *, stoppable: bool = False) -> dict:
    """What step ``name`` did (its command's returncode, stdout and stderr, and the ``path`` it
    made), doing it first if no one has."""
    record = folder / f"{name}.json"
    with open(folder / f"{name}.lock", "w") as lock:  # closing it lets the lock go
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another worker, or this session's thread, is doing it
                if stoppable and _STOP.is_set():
                    raise _Stopped from None
                time.sleep(0.05)
        if not record.exists():
            record.write_text(json.dumps(_DO[name](folder)))
        return json.loads(record.read_text())


def _prepare(folder: Path, steps: set[str]) -> None:
    try:
        for name in _STEPS:
            if name in steps and _step(folder, name, stoppable=True)["returncode"] != 0:
                return  # the fixture that needs it fails, saying why
    except BaseException:  # the fixture that needs the step does it again, and says why it failed
        pass


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start what the collected tests need built and installed, beside them."""
    needed = {n for item in session.items for n in getattr(item, "fixturenames", ()) if n in _STEPS_OF}
    steps = set().union(*(_STEPS_OF[n] for n in needed))
    _ENVIRON.update(environ=dict(os.environ), folder=os.getcwd())
    if steps and not session.config.option.collectonly:
        thread = threading.Thread(
            target=_prepare, args=(_shared_folder(session.config), steps), name="ng-otel wheel", daemon=True
        )
        session.config.stash[_PREPARING] = thread
        thread.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave nothing running. An xdist worker done with its tests lets its step finish, since
    another worker's tests may be waiting for it; otherwise (a session stopped, interrupted or
    on its own) a step still going is cut short, and left unwritten."""
    thread = session.config.stash.get(_PREPARING, None)
    if thread is None:
        return
    others_may_need_it = os.environ.get("PYTEST_XDIST_WORKER") and exitstatus in (0, 1) and not session.shouldstop
    if not others_may_need_it:
        with _STARTING:
            _STOP.set()
            for process in list(_RUNNING):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
    thread.join()


# -- tests that measure what contention changes -------------------------------------------------
# A test marked `alone` asserts on something CPU contention moves (how many spans a queue drops
# while its exporter gets the CPU to drain it, say), as the serial suite ran it: with the machine
# to itself. It starts once the wheel and its venvs are built, and under xdist no other test of
# the run is running beside it: every test holds a shared lock on the run's folder while it runs
# (setup to teardown), an `alone` test the exclusive one, taken behind a gate that lets no new
# test start while it waits.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    alone = item.get_closest_marker("alone") is not None
    if alone and (thread := item.config.stash.get(_PREPARING, None)) is not None:
        thread.join()  # every step this run needs is done
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return (yield)
    folder = _shared_folder(item.config)
    mode = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
    with open(folder / "alone.gate", "w") as gate, open(folder / "alone.lock", "w") as running:
        fcntl.flock(gate, mode)
        fcntl.flock(running, mode)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        return (yield)


@pytest.fixture(scope="session")
def ng_otel_dist(pytestconfig) -> Path:
    """The sdist and wheel of this working tree, built from a clean copy of it."""
    done = _step(_shared_folder(pytestconfig), "dist")
    assert done["returncode"] == 0, done["stdout"][-2000:] + done["stderr"][-2000:]
    return Path(done["path"])


@pytest.fixture(scope="session")
def installed(ng_otel_dist, pytestconfig) -> Installed:
    """ng_otel from its wheel with the demo, no-code, Prometheus and report extras and
    opentelemetry-distro, in one resolver pass (the contrib packages pin the SDK), installed
    under a constraints file of this suite's own versions."""
    done = _step(_shared_folder(pytestconfig), "installed")
    assert done["returncode"] == 0, done["stderr"][-3000:]
    return Installed(Path(done["path"]))


@pytest.fixture(scope="session")
def plain_wheel_venv(ng_otel_dist, pytestconfig) -> Path:
    """A clean venv with the wheel alone installed (``pip install ng_otel-*.whl``): one test's
    own, which goes on to add an extra to it."""
    done = _step(_shared_folder(pytestconfig), "plain")
    assert done["returncode"] == 0, done["stderr"][-2000:]
    return Path(done["path"])


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


@pytest.fixture(scope="session")
def ng_otel_process(tmp_path_factory):
    """Run ``ng-otel`` in a process of its own, from this environment's ``ng_otel`` (no wheel
    to build), from a folder of its own: for what only a process shows (the exporters
    flushed as it exits, its servers, its signals, its exit status)."""
    workdir = tmp_path_factory.mktemp("process-workdir")

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*NG_OTEL_COMMAND, *args],
            capture_output=True,
            text=True,
            env=user_environment(**(env or {})),
            cwd=cwd or workdir,
            timeout=180,
        )

    return run


NG_OTEL_COMMAND = (sys.executable, "-m", "ng_otel.cli")  # the ng-otel command of this environment


@dataclass(frozen=True)
class Ran:
    """What ``ng-otel ARGS`` did, as ``subprocess.CompletedProcess`` says it."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def _captured() -> io.TextIOWrapper:
    """A text stream with a byte buffer beneath it (``summary --json`` writes bytes)."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="\n", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8")


@pytest.fixture
def cli(tmp_path_factory):
    """Run ``ng-otel ARGS`` in this process, ``main(argv)``, as the command would run in one of
    its own: the environment ``ng_otel_process`` gives it (plus ``env``), ``cwd`` (a fresh folder
    by default), ``sys.argv``, stdout and stderr its own (not a terminal: no colour, 200
    columns), and ng_otel's process-wide memory fresh (``fresh_state``). For the commands that
    are a function of files and environment (show, summary, report, kinds, doctor, and any
    command's usage errors); a command that installs telemetry providers (replay's exporters)
    needs ``ng_otel_process``, and running one here fails the test."""
    from opentelemetry import trace

    from ng_otel.cli import main
    from ng_otel.testing import fresh_state

    workdir = tmp_path_factory.mktemp("cli-workdir")

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Ran:
        stdout, stderr = _captured(), _captured()
        provider = trace.get_tracer_provider()
        with pytest.MonkeyPatch.context() as patch, fresh_state():
            for name in list(os.environ):
                if name.startswith(("OTEL_", "NG_OTEL_")):
                    patch.delenv(name)
            for name, value in {"COLUMNS": "200", **(env or {})}.items():
                patch.setenv(name, value)
            patch.chdir(cwd or workdir)
            patch.setattr(sys, "argv", ["ng-otel", *args])
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    returncode = main(list(args))
                except SystemExit as exit:  # argparse's usage errors and --help
                    if isinstance(exit.code, str):
                        sys.stderr.write(exit.code + "\n")
                    returncode = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        assert trace.get_tracer_provider() is provider, f"ng-otel {args[0]} installed providers: use ng_otel_process"
        return Ran(tuple(args), returncode, _text(stdout), _text(stderr))

    return run


# == Shared test helpers ========================================================================
# One rule: a fixture is what has a lifecycle (something started, held or built, and undone
# after); every other shared helper (a class, a constant, a function) is a plain definition here,
# imported by name (`from tests.conftest import raise_chain`). Helpers call one another and serve
# class-scoped fixtures and hypothesis tests, which a function-scoped fixture cannot. No test
# module imports from another.

# -- failure chains -----------------------------------------------------------------------------


class SdkError(Exception):
    """A third-party SDK's error: not a Gym failure, but it carries an HTTP status."""

    def __init__(self, message, status_code):
        super().__init__(message)
        self.status_code = status_code


class TheirGymEvent(Exception):
    """A stand-in for Gym's own NgFailureEvent: the documented API, another class."""

    def __init__(self, kind, reason, *, boundary, event_id, record_extra=None, broken=False):
        super().__init__(reason)
        self.failure_kind, self.failure_reason, self.boundary = kind, reason, boundary
        self.event_id = event_id
        self.record_extra = record_extra or {}
        self.broken = broken

    @property
    def cause_id(self):
        return "their-own-idea"

    def to_record(self):
        if self.broken:
            raise RuntimeError("to_record is broken")
        record = {
            "event_id": self.event_id,
            "boundary": self.boundary,
            "failure_kind": self.failure_kind,
            "failure_reason": self.failure_reason,
            "cause_id": "their-own-idea",
        }
        return record | self.record_extra


def raise_chain(*layers):
    """Raise each layer `from` the previous one; return the top exception."""
    error = None
    for layer in layers:
        try:
            if error is None:
                raise layer
            raise layer from error
        except BaseException as caught:
            error = caught
    return error


def model_timeout():
    """The model server's timeout, as the policy model call records it."""
    return NgFailureEvent(
        "transport_timeout", "model timed out", boundary="model", http_status=504, operation="chat_completions"
    )


def three_level():
    """The agent's run failed because the harness gave up because the model timed out."""
    return raise_chain(
        model_timeout(),
        NgFailureEvent("agent_run_error", "harness gave up", boundary="harness", stage="agent"),
        NgFailureEvent("agent_run_error", "run failed", boundary="agent", stage="agent", http_status=500),
    )


# -- Gym rows -----------------------------------------------------------------------------------

FAILURE = {"failure_reason": "session reset failed", "terminal": True, "failure_kind": "session_lost", "stage": "seed"}


def rollout(**extra):
    """A collector's rollout failure row, with ``extra`` fields replacing its own."""
    base = {
        "episode_id": {"rollout_id": "ep-1", "attempt": 0},
        "run_id": "run-1",
        "source": "collector",
        "delivery": "possibly_delivered",
        "failure": FAILURE,
    }
    return base | extra


# -- ASGI ---------------------------------------------------------------------------------------


async def call(app, path, body=b"{}", method="POST", sent=None):
    """One HTTP request through ``app``'s ASGI interface; returns (status, headers, body).
    ``sent`` collects every message the app sent."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = [] if sent is None else sent
    received = False

    async def receive():
        nonlocal received
        if received:
            await asyncio.sleep(3600)
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, content


# -- waiting and ports --------------------------------------------------------------------------


def wait_until(predicate, timeout, what, *, ignoring=()):
    """Poll ``predicate`` with a short backoff until it returns something true, and return that.
    After ``timeout`` seconds, fail the test saying what it waited for (``what``: a string, or a
    callable for a message made then, such as a log's tail). Exceptions of the ``ignoring`` types
    mean "not yet"."""
    deadline = time.monotonic() + timeout
    pause, last = 0.01, None
    while True:
        try:
            result = predicate()
        except ignoring as error:
            result, last = None, error
        if result:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            told = what() if callable(what) else what
            pytest.fail(f"gave up after {timeout:.0f}s waiting for {told}" + (f" (last: {last!r})" if last else ""))
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.5)


@pytest.fixture
def refused_port():
    """A port on 127.0.0.1 that refuses every connection: bound (so nothing else can take it for
    the test's length) but never listening. For a collector that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def unused_port() -> int:
    """A port number nothing listens on now, for a component that binds by number itself and
    neither takes a socket nor reports the port it bound: OpenTelemetry's Prometheus exporter
    (``start_http_server`` on ``OTEL_EXPORTER_PROMETHEUS_PORT``) and NeMo Gym's server config
    (whose own parser picks ports this way). Another process may take the port before the
    component binds it, so everything that can is handed a socket bound to port 0 instead."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The real Gym venv's session fixtures, registered once for every file that uses them (a file
# importing them would make a second session fixture that waits on the first one's lock).
from tests.gym_lane import gym_env_base, gym_venv  # noqa: E402, F401
