"""What ng_otel costs in a real NeMo Gym 0.7.0 run: the deployment the real-Gym lane starts
(``tests/real_gym/gym_env_lane.sh``: ``gym env start`` of stock servers, ``simpleqa`` with its
judge, ``simple_agent``, two ``openai_model`` servers, against the lane's local
OpenAI-compatible endpoint), rollouts collected with ``gym eval run --no-serve`` at Gym's
default concurrency (every rollout dispatched at once), all of it inside a private network
namespace with only loopback, since Ray listens on every interface.

Each round starts the deployment three times, the order turned every round: without ng_otel;
with it exactly as docs/gym.md installs it (``opentelemetry-instrument``, ``NG_OTEL_ENABLED=1``,
OTLP to ``ng-otel receive`` in its own process; every other setting at its default); and the
floor, OpenTelemetry alone as a user without ng_otel sets it up (``tools/real-gym.sh
otel-alone``: ``opentelemetry-distro`` and the FastAPI instrumentation under
``opentelemetry-instrument``, OTLP to the same receiver), whose ratios are printed beside with
no target, so what OpenTelemetry itself costs and what ng_otel adds above it stay apart. Each
deployment first collects a few rollouts to warm up, then two measured collections: a healthy
one, and one whose endpoint fails one request in 20 (a 500 from the policy model, or two
dropped connections that Gym's retries get past: the failures the lane produces).

Figures, per collection: rollouts/s over the collection's rollouts (from its first model
request to its last, as the endpoint saw them: the collection's own start-up, reported on its
own line, is not in it), and CPU seconds per rollout of every Gym process together (every
server, Ray, the head server, the collection; user plus system from ``/proc``, the processes
that exit counted as they are reaped) over the same span plus the span processor's default
schedule delay, so the last spans' export is billed to the collection that made them. Every
figure is a ratio with / without in one round: the median over rounds, the range in brackets.

A collection is 1,000 rollouts by default: at 300 one lasted 3-4 s here, shorter than the drain
after it, and its figures moved by 30 % from round to round.

Targets: rollouts/s with / without >= 0.97; CPU per rollout with / without <= 1.05; both for
the healthy and the failing pair. Needs root (the network namespace); without it the bench
says so and exits 2.
Run: .venv/bin/python bench/gym_run.py [--rounds 3] [--rollouts 1000] [--keep]
Diagnosis (no verdict of its own): ``--also NAME:KEY=VALUE[,KEY=VALUE]`` adds a variant, docs/gym.md's
setup with those settings, its ratios to without printed; ``--per-process`` prints each process's
CPU per rollout, every round; ``--profile`` samples each process with py-spy in one more
collection with ng_otel (round 1, not measured) and prints where their CPU goes, by component.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _procs import CLOCK_TICKS, cpu_seconds, turn_order  # noqa: E402
from profile_path import Frame, record, stacks  # noqa: E402  (py-spy, as bench/profile_path.py runs it)

ROOT = HERE.parent
LANE = ROOT / "tests" / "real_gym"  # the lane's endpoint that fails on cue, and its judge config
# The floor: OpenTelemetry as a user without ng_otel sets it up (tools/real-gym.sh otel-alone:
# opentelemetry-distro, the FastAPI instrumentation), its figures beside, no target of its own.
FLOOR = "otel-alone"
VARIANTS = ["without", "with", FLOOR]
TITLES = {"without": "without ng_otel", "with": "with ng_otel", FLOOR: "OpenTelemetry alone"}
FAIL_EVERY = 20  # the failing collection: one rollout in 20 meets a failing endpoint
CUES = ("FAIL500", "DROPTWICE")  # tests/real_gym/fake_openai.py: a 500, or two dropped connections
WARMUP_ROLLOUTS = 20
# Below these a run's figures are no verdict: start-up, or one round, would be what is measured.
MIN_ROLLOUTS = 200
MIN_ROUNDS = 3
RATE_TARGET = 0.97  # rollouts/s with / without, at least
CPU_TARGET = 1.05  # CPU per rollout with / without, at most
# The span processor's default schedule delay (OTEL_BSP_SCHEDULE_DELAY, 5 s) and a margin: the
# last spans of a collection are exported within it, billed to that collection.
DRAIN = 6.0
SAMPLE_EVERY = 0.1  # seconds between samples of the Gym processes' CPU
READY_TIMEOUT = 300  # gym env start, until its head server answers
COLLECT_TIMEOUT = 600
PROFILE_SECONDS = 10  # --profile: py-spy's window, inside a collection of twice --rollouts
# --profile: where a sample's time goes, by the deepest frame outside the standard library (a
# gRPC or protobuf frame is the exporter's when an OpenTelemetry frame is below it); first match.
COMPONENTS = (
    ("/ng_otel/", "ng_otel"),
    ("/aiohttp/tracing.py", "ng_otel"),  # aiohttp's tracing runs for ng_otel's TraceConfig alone (Gym sets none)
    ("/opentelemetry/instrumentation/", "OTel instrumentation"),
    ("/opentelemetry/sdk/metrics/", "OTel metrics"),
    ("/opentelemetry/exporter/", "OTel export"),
    ("/opentelemetry/proto/", "OTel export"),
    ("/opentelemetry/sdk/_shared_internal/", "OTel export"),
    ("/opentelemetry/sdk/trace/export/", "OTel export"),
    ("/opentelemetry/", "OTel spans, context"),
)
GYM_COMPONENT = "Gym, its libraries"
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
SERVER_VENVS = (  # Gym's prebuilt-venv mode: each server's venv is the variant's (Lane.use_server_venvs)
    "resources_servers/simpleqa",
    "responses_api_models/openai_model",
    "responses_api_agents/simple_agent",
    "environment_servers/legacy_agent",
)


# == Outside the namespace: the Gym venv with this tree's ng_otel, then the namespace ==========


def cannot_run() -> str | None:
    """Why this machine cannot give Ray a loopback-only network namespace, or None."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("unshare", "ip", "timeout") if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found"
    probe = subprocess.run(["unshare", "--net", "--pid", "--fork", "true"], capture_output=True, text=True)
    return f"unshare --net failed: {probe.stderr.strip()}" if probe.returncode else None


def gym_venv_with_this_tree() -> Path:
    """tools/real-gym.sh's cached Gym venv, with ng_otel built from this working tree."""
    with tempfile.TemporaryDirectory() as folder:
        source, out = Path(folder) / "source", Path(folder) / "dist"
        shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
            check=True,
            capture_output=True,
        )
        (wheel,) = out.glob("ng_otel-*.whl")
        done = subprocess.run(
            ["bash", str(ROOT / "tools" / "real-gym.sh"), "install", str(wheel)], capture_output=True, text=True
        )
    if done.returncode:
        raise RuntimeError(f"tools/real-gym.sh install failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def prepared_venv(what: str) -> Path:
    done = subprocess.run(["bash", str(ROOT / "tools" / "real-gym.sh"), what], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tools/real-gym.sh {what} failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def outside(args: argparse.Namespace, argv: list[str]) -> int:
    why = cannot_run()
    if why:
        print(f"gym run: not measured: it runs Ray in a loopback-only network namespace, which needs root ({why})")
        return 2
    venv = gym_venv_with_this_tree()
    floor = prepared_venv("otel-alone")
    limit = 600 + args.rounds * 900  # three deployments and nine collections a round, with room
    command = [
        "timeout",
        "-k",
        "10",
        str(limit),
        "unshare",
        "--net",
        "--pid",
        "--fork",
        "--mount-proc",
        sys.executable,
        str(Path(__file__).resolve()),
        "--inside",
        str(venv),
        "--floor-venv",
        str(floor),
        *argv,
    ]
    return subprocess.run(command, cwd="/").returncode


# == Inside: Gym's processes and what they cost ================================================


class GymCpu:
    """CPU seconds used so far by every process in this namespace but the bench's own: this one
    (PID 1), and those it names in ``exclude``. A process that ends is counted when it is reaped:
    by its parent, in the parent's own count; by this process, in ``reaped``. So a total never
    loses what ended between two samples."""

    def __init__(self) -> None:
        self.exclude = {os.getpid()}
        self.mine: set[int] = set()  # processes this one started and reaps itself (``wait``)
        self.reaped = 0.0
        self._lock = threading.Lock()
        self._samples: list[tuple[float, float]] = []
        self._sampling = threading.Event()

    def others(self) -> Iterator[tuple[int, list[str]]]:
        """Each process but the bench's, with its ``/proc/PID/stat`` fields after the command."""
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in self.exclude:
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone since the listing: its parent's count has it
            yield int(entry.name), fields

    def total(self) -> float:
        with self._lock:
            live = 0
            for pid, fields in self.others():
                if fields[0] == "Z" and int(fields[1]) == os.getpid() and pid not in self.mine:
                    self.reaped += _seconds(os.wait4(pid, 0)[2])  # an orphan, reparented to PID 1
                    continue
                live += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
            return live / CLOCK_TICKS + self.reaped

    def by_process(self) -> dict[str, float]:
        """CPU seconds so far of each live process but the bench's, by what it is (``--per-process``:
        where a cost lies; the processes reaped since are under ``reaped``)."""
        seconds: dict[str, float] = {"reaped": self.reaped}
        for pid, fields in self.others():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    argv = cmdline.read().decode(errors="replace").split("\0")
                where = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            label = f"{Path(where).parent.name}/{Path(where).name} {Path(argv[0]).name} {' '.join(argv[1:4])[:60]}"
            seconds[label] = seconds.get(label, 0.0) + sum(int(v) for v in fields[11:15]) / CLOCK_TICKS
        return seconds

    def start(self, command: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )  # its own group: Ctrl-C reaches every process
        self.mine.add(process.pid)
        return process

    def ended(self, process: subprocess.Popen[bytes], block: bool = False) -> bool:
        """Whether ``process`` has ended; reaps it with its CPU time (never ``Popen.wait``: the
        time would be lost)."""
        if process.returncode is not None:
            return True
        with self._lock:
            pid, status, usage = os.wait4(process.pid, 0 if block else os.WNOHANG)
            if not pid:
                return False
            self.reaped += _seconds(usage)
            process.returncode = os.waitstatus_to_exitcode(status)
            self.mine.discard(process.pid)
            return True

    def sampling(self) -> Callable[[float], float]:
        """Start sampling ``total`` in a thread; call the result to stop, after which it answers
        the total at any time between (linear between samples)."""
        self._samples = [(time.time(), self.total())]
        self._sampling.clear()

        def sample() -> None:
            while not self._sampling.wait(SAMPLE_EVERY):
                self._samples.append((time.time(), self.total()))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()

        def stop_and_read(at: float) -> float:
            if thread.is_alive():
                self._sampling.set()
                thread.join()
                self._samples.append((time.time(), self.total()))
            for (t0, cpu0), (t1, cpu1) in itertools.pairwise(self._samples):
                if t0 <= at <= t1:
                    return cpu0 + (cpu1 - cpu0) * (at - t0) / (t1 - t0 or 1)
            raise ValueError(f"{at} is outside the samples")

        return stop_and_read


def _seconds(usage: resource.struct_rusage) -> float:
    return float(usage.ru_utime + usage.ru_stime)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


@dataclass
class Collection:
    rollouts: int
    rate: float  # rollouts/s from the first model request to the last
    cpu: float  # CPU s per rollout of every Gym process
    startup: float  # s from gym eval run's start to its first model request
    failure_events: int  # ng.failure events the receiver got for it
    traced: float  # the share of the endpoint's requests that carried a traceparent
    per_process: dict[str, float]  # CPU s per rollout by process, launch to drain (--per-process)


class Lane:
    """The namespace's fixed parts: Gym's folders, the endpoint that fails on cue, the receiver."""

    def __init__(self, venvs: dict[str, Path], work: Path, cpu: GymCpu, also: dict[str, dict[str, str]]) -> None:
        venv = venvs["with"]
        self.venvs, self.venv, self.work, self.cpu, self.also = venvs, venv, work, cpu, also
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="ngr.", dir="/tmp"))  # AF_UNIX paths: 107 bytes
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NG_OTEL_", "NEMO_GYM_"))}
        for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            self.env.pop(key, None)
        self.env.update(
            PATH=f"{venv / 'bin'}:{self.env.get('PATH', '/usr/bin:/bin')}",
            HOME=str(work / "home"),
            TMPDIR=str(work / "tmp"),
            RAY_TMPDIR=str(self.ray_tmp),
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONUNBUFFERED="1",
        )
        for name in ("home", "tmp", "gym", "runs"):
            (work / name).mkdir(parents=True, exist_ok=True)
        for server in SERVER_VENVS:
            (work / "venvs" / server).mkdir(parents=True, exist_ok=True)
        self.fake_port, self.grpc_port = free_port(), free_port()
        self.requests_log, self.otlp = work / "fake_requests.jsonl", work / "otlp.jsonl"
        self.fake = subprocess.Popen(
            [str(venv / "bin" / "python"), str(LANE / "fake_openai.py"), str(self.fake_port), str(self.requests_log)],
            stderr=subprocess.DEVNULL,
        )
        self.receiver = subprocess.Popen(
            [
                str(venv / "bin" / "ng-otel"),
                "receive",
                "--grpc-port",
                str(self.grpc_port),
                "--http-port",
                "0",
                "--out",
                str(self.otlp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        cpu.exclude |= {self.fake.pid, self.receiver.pid}
        wait_for(lambda: answers(f"http://127.0.0.1:{self.fake_port}/v1/models"), 30, "the fake endpoint")
        wait_for(lambda: self._receiving(), 60, "ng-otel receive")

    def _receiving(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.grpc_port)) == 0

    def variant_env(self, variant: str) -> tuple[list[str], dict[str, str]]:
        """The command prefix and environment of a variant: docs/gym.md's, or nothing at all; an
        ``--also`` variant is docs/gym.md's with its own settings on top."""
        if variant == "without":
            return [], dict(self.env)
        venv = self.venv_of(variant)
        env = {**self.env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.grpc_port}"}
        if variant == FLOOR:
            env["PATH"] = f"{venv / 'bin'}:{self.env['PATH']}"
        else:
            env.update({"NG_OTEL_ENABLED": "1", **self.also.get(variant, {})})
        return [str(venv / "bin" / "opentelemetry-instrument"), "--"], env

    def venv_of(self, variant: str) -> Path:
        return self.venvs.get(variant, self.venv)  # an --also variant: docs/gym.md's venv

    def use_server_venvs(self, variant: str) -> None:
        """Gym's servers run in the venv their folder's ``.venv`` names: the variant's."""
        for server in SERVER_VENVS:
            link = self.work / "venvs" / server / ".venv"
            link.unlink(missing_ok=True)
            link.symlink_to(self.venv_of(variant))

    def close(self) -> None:
        for process in (self.fake, self.receiver):
            process.terminate()
            process.wait(timeout=30)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def wait_for(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready in {timeout:.0f} s")
        time.sleep(0.2)


class Deployment:
    """``gym env start`` of the lane's stock servers, without or with ng_otel."""

    def __init__(self, lane: Lane, variant: str, name: str) -> None:
        self.lane, self.variant, self.name = lane, variant, name
        prefix, self.env = lane.variant_env(variant)
        lane.use_server_venvs(variant)
        started = time.monotonic()
        for attempt in range(3):
            self.head_port = free_port()
            self.log = lane.work / "runs" / f"{name}.env_start.{attempt}.log"
            self.process = lane.cpu.start(
                [
                    *prefix,
                    "gym",
                    "env",
                    "start",
                    "--resources-server",
                    "simpleqa",
                    "--model-type",
                    "openai_model",
                    "--config",
                    str(LANE / "judge_model.yaml"),
                    "--model-url",
                    f"http://127.0.0.1:{lane.fake_port}/v1",
                    "--model-api-key",
                    "dummy",
                    "--model",
                    "fake-policy",
                    f"+head_server.port={self.head_port}",
                    "+skip_venv_if_present=true",
                    f"+uv_venv_dir={lane.work / 'venvs'}",
                    "+server_spinup_timeout_seconds=200",
                    "+model_endpoint_readiness_timeout_seconds=30",
                ],
                self.log,
                self.env,
                lane.work / "gym",
            )
            if self._ready():
                self.startup = time.monotonic() - started
                return
            # Ray's GCS, on a kernel-chosen port, can take the head server's port before it binds
            # (the lane meets it too): start again on another port.
            self.stop()
        raise RuntimeError(f"{name}: gym env start lost its head server's port three times")

    def _ready(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT
        lost = f"error while attempting to bind on address ('127.0.0.1', {self.head_port})"
        while not answers(f"http://127.0.0.1:{self.head_port}/readyz"):
            if lost in self.log.read_text(errors="replace"):
                return False
            if self.lane.cpu.ended(self.process) or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: gym env start never ready:\n{tail(self.log)}")
            time.sleep(0.5)
        return True

    def profile(self, name: str, rollouts: int, out: Path) -> dict[str, tuple[float, collections.Counter[str]]]:
        """A healthy collection of ``rollouts`` that is not measured: from its first model request,
        py-spy samples each of the deployment's processes for ``PROFILE_SECONDS``. By process:
        its CPU seconds in that window, its samples by component."""
        found: dict[str, tuple[float, collections.Counter[str]]] = {}
        size = self.lane.requests_log.stat().st_size if self.lane.requests_log.exists() else 0

        def sample() -> None:
            wait_for(lambda: self.lane.requests_log.stat().st_size > size, 120, f"{name}'s first model request")
            found.update(profile_processes(self.lane.cpu, out))

        self.collect(name, rollouts, 0, during=sample)
        return found

    def collect(
        self, name: str, rollouts: int, fail_every: int, during: Callable[[], None] | None = None
    ) -> Collection:
        """``gym eval run`` of ``rollouts`` fresh tasks (one in ``fail_every`` cued to fail; 0:
        none), measured."""
        lane, nonce = self.lane, uuid.uuid4().hex[:8]
        tasks = lane.work / "runs" / f"{name}.tasks.jsonl"
        with tasks.open("wb") as out:
            for index in range(rollouts):
                cue = CUES[(index // fail_every) % len(CUES)] + " " if fail_every and index % fail_every == 0 else ""
                question = f"{cue}{nonce}-{index}: What is the capital of France?"
                out.write(
                    orjson.dumps(
                        {
                            "id": f"{nonce}-{index}",
                            "question": question,
                            "expected_answer": "Paris",
                            "agent_ref": {"type": "responses_api_agents", "name": "simpleqa_simple_agent"},
                            "responses_create_params": {"input": [{"role": "user", "content": question}]},
                        }
                    )
                    + b"\n"
                )
        output = lane.work / "runs" / f"{name}.rollouts.jsonl"
        prefix, _ = lane.variant_env(self.variant)
        otlp_before = lane.otlp.stat().st_size if lane.otlp.exists() else 0
        before = lane.cpu.by_process()
        read_cpu = lane.cpu.sampling()
        launched = time.time()
        process = lane.cpu.start(
            [
                *prefix,
                "gym",
                "eval",
                "run",
                "--no-serve",
                f"+head_server.port={self.head_port}",
                "--agent",
                "simpleqa_simple_agent",
                "--input",
                str(tasks),
                "--output",
                str(output),
                "+route_failures_to_sidecar=true",
            ],
            lane.work / "runs" / f"{name}.eval_run.log",
            self.env,
            lane.work / "gym",
        )
        beside = threading.Thread(target=during, daemon=True) if during else None
        if beside:
            beside.start()
        deadline = time.monotonic() + COLLECT_TIMEOUT
        while not lane.cpu.ended(process):
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                lane.cpu.ended(process, block=True)
                raise RuntimeError(f"{name}: gym eval run did not finish in {COLLECT_TIMEOUT} s")
            time.sleep(0.2)
        if beside:
            beside.join(timeout=PROFILE_SECONDS + 120)
        seen = [row for row in read_jsonl(lane.requests_log) if row["t"] >= launched]
        if process.returncode or not seen:
            raise RuntimeError(
                f"{name}: gym eval run exited {process.returncode}:\n{tail(output.parent / (name + '.eval_run.log'))}"
            )
        first, last = min(row["t"] for row in seen), max(row["t"] for row in seen)
        time.sleep(max(0.0, last + DRAIN + 2 * SAMPLE_EVERY - time.time()))
        cpu = read_cpu(last + DRAIN) - read_cpu(first)
        after = lane.cpu.by_process()
        per_process = {k: (v - before.get(k, 0.0)) / rollouts for k, v in after.items()}
        written = len(read_jsonl(output)) + len(read_jsonl(output.with_name(output.stem + "_failures.jsonl")))
        if written != rollouts:
            raise RuntimeError(f"{name}: {written} rows for {rollouts} rollouts")
        exported = lane.otlp.read_bytes()[otlp_before:] if lane.otlp.exists() else b""
        if self.variant == "without" and exported:
            raise RuntimeError(f"{name}: the receiver got {len(exported)} bytes from a deployment without ng_otel")
        return Collection(
            rollouts=rollouts,
            rate=rollouts / (last - first),
            cpu=cpu / rollouts,
            startup=first - launched,
            failure_events=exported.count(b'"name":"ng.failure"'),  # span events, as ng-otel receive writes them
            traced=sum(1 for row in seen if row.get("traceparent")) / len(seen),
            per_process=per_process,
        )

    def stop(self) -> None:
        """Ctrl-C to every process of the deployment, as a terminal sends it; then whatever is
        left of it, Ray's processes included (everything in this namespace is the bench's)."""
        cpu = self.lane.cpu
        try:
            os.killpg(self.process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 60
        while not cpu.ended(self.process) and time.monotonic() < deadline:
            time.sleep(0.5)
        subprocess.run(
            [str(self.lane.venv / "bin" / "ray"), "stop", "--force"],
            env=self.env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) not in cpu.exclude:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        cpu.ended(self.process, block=True)
        cpu.total()  # reaps the orphans


def profile_processes(cpu: GymCpu, out: Path) -> dict[str, tuple[float, collections.Counter[str]]]:
    """py-spy (``--gil``: the thread holding the interpreter) on each process ng_otel is enabled
    in, at once for ``PROFILE_SECONDS``: by process, its CPU seconds then, its samples by component."""
    out.mkdir(parents=True, exist_ok=True)
    processes = instrumented_processes(cpu.exclude)
    before = {pid: process_cpu(pid) for pid in processes}
    spies = {pid: record(pid, PROFILE_SECONDS, out / f"{pid}.txt") for pid in processes}
    cpu.exclude |= {spy.pid for spy in spies.values()}  # the profiled collection is not measured, still
    for spy in spies.values():
        spy.wait(timeout=PROFILE_SECONDS + 60)
    found: dict[str, tuple[float, collections.Counter[str]]] = {}
    for pid, label in processes.items():
        path = out / f"{pid}.txt"
        counts = collections.Counter[str]()
        for frames, count in stacks(path) if path.exists() else []:
            counts[component(frames)] += count
        used, known = process_cpu(pid) - before[pid], found.get(label, (0.0, collections.Counter[str]()))
        found[label] = (known[0] + used, known[1] + counts)  # a server of two processes is one line
    return found


def instrumented_processes(exclude: set[int]) -> dict[int, str]:
    """The Python processes started with docs/gym.md's ``NG_OTEL_ENABLED=1``, but Ray's: by the Gym
    server they run (``NEMO_GYM_CONFIG_PATH``), or their command (``gym eval run``)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if b"NG_OTEL_ENABLED=1" not in environ or not Path(argv[0]).name.startswith("python"):
            continue
        if any("/ray/" in arg for arg in argv[:4]):  # python [-u] .../ray/...
            continue
        server = next((v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"NEMO_GYM_CONFIG_PATH=")), "")
        command = " ".join([Path(argv[1]).name, *argv[2:4]]) if len(argv) > 1 else argv[0]
        found[int(entry.name)] = server or command
    return found


def process_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` itself so far, 0 once it is gone."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def component(frames: list[Frame]) -> str:
    """What a sample's time is spent in: its deepest frame outside the standard library decides."""
    for _, where in reversed(frames):
        if where.startswith("<") or ("/lib/python3" in where and "/site-packages/" not in where):
            continue  # the standard library: the frame that called it decides
        if "/grpc/" in where or "/google/protobuf/" in where:  # Ray's gRPC too, in Gym's processes
            return "OTel export" if any("/opentelemetry/" in below for _, below in frames) else GYM_COMPONENT
        return next((name for part, name in COMPONENTS if part in where), GYM_COMPONENT)
    return GYM_COMPONENT


def print_profile(profile: dict[str, tuple[float, collections.Counter[str]]]) -> None:
    """Each process's samples by component, and all of them weighted by each one's CPU."""
    names = [GYM_COMPONENT, *dict.fromkeys(name for _, name in COMPONENTS)]
    print(
        f"  profile, with, a healthy collection not measured (py-spy --gil, {PROFILE_SECONDS} s): "
        "each process's CPU then, and its samples by component"
    )
    print(f"    {'process':30s} {'CPU s':>6s}  " + "  ".join(f"{name[:20]:>20s}" for name in names))
    weighted = collections.Counter[str]()
    for label, (used, counts) in sorted(profile.items(), key=lambda item: -item[1][0]):
        total = sum(counts.values())
        if not total:
            print(f"    {label[:30]:30s} {used:6.2f}  (no samples)")
            continue
        print(f"    {label[:30]:30s} {used:6.2f}  " + "  ".join(f"{counts[n] / total:20.1%}" for n in names))
        for name in names:
            weighted[name] += used * counts[name] / total
    used = sum(weighted.values())
    if used:
        print(f"    {'all, by CPU':30s} {used:6.2f}  " + "  ".join(f"{weighted[n] / used:20.1%}" for n in names))
        telemetry = 1 - weighted[GYM_COMPONENT] / used
        print(
            f"    ng_otel and OpenTelemetry: {telemetry:.1%} of these processes' CPU, ng_otel's own "
            f"{weighted['ng_otel'] / used:.1%}: CPU with / without near {1 / (1 - telemetry):.2f} from them alone"
        )


def read_jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def span(values: list[float]) -> str:
    return f"[{min(values):.3f}-{max(values):.3f}]"


def inside(args: argparse.Namespace) -> int:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    work = Path(tempfile.mkdtemp(prefix="ng-otel-gym-run."))
    cpu = GymCpu()
    also = dict(args.also)
    variants = VARIANTS + list(also)
    lane = Lane({"without": args.inside, "with": args.inside, FLOOR: args.floor_venv}, work, cpu, also)
    results: list[dict[str, dict[str, Collection]]] = []  # per round: variant -> mix -> collection
    startups: dict[str, list[float]] = {variant: [] for variant in variants}
    profile: dict[str, tuple[float, collections.Counter[str]]] = {}
    try:
        for index in range(args.rounds):
            round_: dict[str, dict[str, Collection]] = {}
            for variant in turn_order(variants, index):
                name = f"r{index + 1}-{variant}"
                deployment = Deployment(lane, variant, name)
                try:
                    startups[variant].append(deployment.startup)
                    deployment.collect(f"{name}-warmup", WARMUP_ROLLOUTS, 0)
                    round_[variant] = {
                        "healthy": deployment.collect(f"{name}-healthy", args.rollouts, 0),
                        "failing": deployment.collect(f"{name}-failing", args.rollouts, FAIL_EVERY),
                    }
                    if args.profile and variant == "with" and index == 0:
                        profile = deployment.profile(f"{name}-profile", 2 * args.rollouts, work / "profile")
                finally:
                    deployment.stop()
            results.append(round_)
            print(
                f"  round {index + 1}: "
                + "; ".join(
                    f"{variant} {mix} {c.rate:.1f} rollouts/s {c.cpu * 1e3:.1f} ms CPU/rollout"
                    + (
                        f" ({c.failure_events} ng.failure events, {c.traced:.0%} of model requests traced)"
                        if variant != "without"
                        else ""
                    )
                    for variant in variants
                    for mix, c in round_[variant].items()
                ),
                flush=True,
            )
            if args.per_process:
                print_per_process(round_)
            if args.profile and index == 0:
                print_profile(profile)
    finally:
        lane.close()
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if report(results, startups, list(also)) else 1


def print_per_process(round_: dict[str, dict[str, Collection]]) -> None:
    """Each process's CPU per rollout in each variant's healthy collection, largest first."""
    for mix in ("healthy", "failing"):
        labels = sorted(
            {label for collections in round_.values() for label in collections[mix].per_process},
            key=lambda label: -max(c[mix].per_process.get(label, 0.0) for c in round_.values()),
        )
        print(f"    per process, {mix}, ms CPU/rollout: " + " | ".join(round_))
        for label in labels[:14]:
            values = " | ".join(f"{c[mix].per_process.get(label, 0.0) * 1e3:6.2f}" for c in round_.values())
            print(f"      {values}  {label}")


def report(results: list[dict[str, dict[str, Collection]]], startups: dict[str, list[float]], also: list[str]) -> bool:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    # No verdict: the floor's own cost, ng_otel's above it, and each --also diagnosis.
    for variant, base in [(FLOOR, "without"), ("with", FLOOR), *((name, "without") for name in also)]:
        print(
            f"  {variant} / {base} (no target): "
            + ", ".join(
                f"{mix} rollouts/s {median([r[variant][mix].rate / r[base][mix].rate for r in results]):.3f} "
                f"{span([r[variant][mix].rate / r[base][mix].rate for r in results])} "
                f"CPU {median([r[variant][mix].cpu / r[base][mix].cpu for r in results]):.3f} "
                f"{span([r[variant][mix].cpu / r[base][mix].cpu for r in results])}"
                for mix in ("healthy", "failing")
            )
        )

    first_request = {v: median([r[v][m].startup for r in results for m in r[v]]) for v in VARIANTS}
    print(
        f"start-up, not in the figures (medians): gym env start ready in {median(startups['without']):.1f} s "
        f"without, {median(startups['with']):.1f} s with; a collection's first model request "
        f"{first_request['without']:.1f} s after gym eval run starts without, {first_request['with']:.1f} s with"
    )
    for variant in VARIANTS:
        print(
            f"  {TITLES[variant]} (medians): "
            + ", ".join(
                f"{mix} {median([r[variant][mix].rate for r in results]):.1f} rollouts/s "
                f"{median([r[variant][mix].cpu for r in results]) * 1e3:.1f} ms CPU/rollout"
                for mix in ("healthy", "failing")
            )
        )
    ok = True
    found: dict[str, float] = {}
    for key, title, sense, target in (
        ("rate", "rollouts/s", ">=", RATE_TARGET),
        ("cpu", "CPU per rollout", "<=", CPU_TARGET),
    ):
        for mix, label in (("healthy", "healthy"), ("failing", f"1 in {FAIL_EVERY} failing")):
            ratios = [getattr(r["with"][mix], key) / getattr(r["without"][mix], key) for r in results]
            found[f"{key} {mix}"] = value = median(ratios)
            met = value >= target if sense == ">=" else value <= target
            ok &= met
            print(
                f"{title} with / without ng_otel, {label}: {value:.3f} {span(ratios)} (target {sense} {target:.2f}) "
                + ("ok" if met else "OVER TARGET")
            )
    failing_with = [r["with"]["failing"] for r in results]
    events_ok = all(c.failure_events >= c.rollouts // FAIL_EVERY for c in failing_with)
    ok &= events_ok
    print(
        f"ng.failure events received per failing collection with ng_otel: {[c.failure_events for c in failing_with]} "
        f"(target: at least the {failing_with[0].rollouts // FAIL_EVERY} failing rollouts') "
        + ("ok" if events_ok else "MISSING")
    )
    print(
        f"gym run: rollouts/s ratio {found['rate healthy']:.3f} (healthy) {found['rate failing']:.3f} (failing), "
        f"cpu per rollout ratio {found['cpu healthy']:.3f} (healthy) {found['cpu failing']:.3f} (failing)"
    )
    return ok


def also_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition(":")
    if not name or name in VARIANTS or not settings:
        raise argparse.ArgumentTypeError(f"{text!r}: NAME:KEY=VALUE[,KEY=VALUE], NAME not one of {VARIANTS}")
    pairs = [setting.partition("=") for setting in settings.split(",")]
    if any(not key or not eq for key, eq, _ in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: each setting is KEY=VALUE")
    return name, {key: value for key, _, value in pairs}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--rollouts", type=int, default=1000, help=f"per measured collection (a verdict needs {MIN_ROLLOUTS})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, rows, spans) and print it")
    parser.add_argument(
        "--also",
        type=also_variant,
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="a further variant, docs/gym.md's with these settings, its ratios printed with no target",
    )
    parser.add_argument("--per-process", action="store_true", help="print each process's CPU per rollout")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="in round 1, one more healthy collection with ng_otel, py-spy on each process: where the CPU goes",
    )
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)  # the Gym venv, in the namespace
    parser.add_argument("--floor-venv", type=Path, help=argparse.SUPPRESS)  # tools/real-gym.sh otel-alone's
    args = parser.parse_args(argv)
    if args.inside:
        code = inside(args)
        if args.rollouts < MIN_ROLLOUTS or args.rounds < MIN_ROUNDS:
            print(f"a smoke run: below {MIN_ROLLOUTS} rollouts and {MIN_ROUNDS} rounds the figures are no verdict")
            return code or 1
        return code
    print(
        f"gym run: real NeMo Gym 0.7.0, {args.rounds} rounds of {args.rollouts} rollouts healthy and "
        f"{args.rollouts} with 1 in {FAIL_EVERY} failing, without and with ng_otel, and OpenTelemetry alone",
        flush=True,
    )
    return outside(args, [a for a in argv if a != "--inside"])


if __name__ == "__main__":
    sys.exit(main())
