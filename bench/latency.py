"""p50 latency, one request at a time, of the same app (OpenTelemetry's FastAPI instrumentation,
uvicorn on uvloop and httptools) plain, with ng_otel, with ng_otel switched off
(``NG_OTEL_ENABLED=0``), and with the hand-written minimum of what the contract adds to a
failing reply (``_latency_app.minimum_handler``), all called alternately from this one. The
healthy and switched-off figures compare apps in one process (``_latency_app.together``:
plain beside ng_otel, plain beside switched off): their code differs by less than two
processes of the same code differ here, so only one process says what the code costs (the
healthy ratio of two processes is printed for scale). The chain against the minimum, whose
difference is larger, is two processes. Then the same app with ng_otel exporting to a live
OTLP receiver vs to a dead endpoint.

Each figure is taken as ``failing_path.py`` takes its own: over several launches, each a fresh
set of server processes (two processes of the same code differ here by more than the targets),
the ratio of two servers' p50s side by side in one launch; the figure is the median over
launches, the range in brackets.

Targets: a request with no failure at most 1.01x plain; a reply carrying a three-event chain
at most 1.10x the hand-written minimum (the failing request's target against the minimum, as in
``failing_path.py``); switched off, within 1 % of plain either way (healthy and failing);
failing requests with the collector dead vs alive at most 1.10x. The chain against plain is
printed for scale.
Run: .venv/bin/python bench/latency.py [requests per variant, default 3500, over 7 launches]
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _procs import turn_order  # noqa: E402

# Both servers share one core and the client has the other: requests are sequential, so the
# servers never compete, and no process migrates between cores mid-measurement.
CPUS = sorted(os.sched_getaffinity(0))
CLIENT_CPUS, SERVER_CPUS = ({CPUS[0]}, {CPUS[-1]}) if len(CPUS) > 1 else (set(CPUS), set(CPUS))


# Each measurement runs in fresh sets of server processes, its samples pooled: two processes of
# the same code differ here per launch (two plain servers read 0.95-1.26 of each other in four
# launches; the same hash seed in all of them did not narrow it).
LAUNCHES = 7

HEALTHY, HEALTHY_TARGET = "p50 latency, no failure, ng_otel vs plain (one process)", 1.01
HEALTHY_APART = "no failure, ng_otel vs plain, apart"
CHAIN, CHAIN_TARGET = "p50 latency, reply with a 3-event chain, ng_otel vs the hand-written minimum", 1.10
CHAIN_PLAIN, MINIMUM_PLAIN = "3-event chain, ng_otel vs plain", "3-event chain, minimum vs plain"
OFF_HEALTHY, OFF_CHAIN, OFF_TARGET = (
    "p50 latency, no failure, switched off vs plain",
    "p50 latency, 3-event chain, switched off vs plain",
    1.01,
)
DEAD, DEAD_TARGET = "p50 latency of failing requests, collector dead vs alive", 1.10


def _pin(cpus: set[int]):  # type: ignore[no-untyped-def]
    return lambda: os.sched_setaffinity(0, cpus)


ENV = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
ENV.pop("NG_OTEL_ENABLED", None)


def start(variant: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int, socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    process = subprocess.Popen(
        [sys.executable, str(HERE / "_latency_app.py"), str(sock.fileno()), variant],
        pass_fds=(sock.fileno(),),
        env={**ENV, **(env or {})},
        preexec_fn=_pin(SERVER_CPUS),
        stderr=subprocess.DEVNULL,  # a dead collector makes the exporters log every retry
    )
    return process, sock.getsockname()[1], sock


def wait_ready(port: int, path: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", path)
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("benchmark server did not start")


class KeepAliveClient:
    """A minimal HTTP/1.1 client: the cost measured is the server's, not a client's header
    parser (http.client parses headers with the email package, which would bill every extra
    header byte to the server)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get(self, path: str) -> bytes:
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            body += self.sock.recv(65536)
        return head


Samples = dict[str, list[float]]


def timed_in_turn(routes: dict[str, tuple[int, str]], requests: int, samples: Samples) -> None:
    """``requests`` to each route (name: port and path), the routes in turn; each latency
    appended to ``samples`` under its route's name."""
    clients = {name: (KeepAliveClient(port), path) for name, (port, path) in routes.items()}
    names = list(routes)
    for index in range(requests + 200):
        for name in turn_order(names, index):  # every route takes every place equally often
            client, path = clients[name]
            start = time.perf_counter()
            client.get(path)
            elapsed = time.perf_counter() - start
            if index >= 200:  # warm-up
                samples.setdefault(name, []).append(elapsed)


def on(ports: dict[str, int], path: str) -> dict[str, tuple[int, str]]:
    return {name: (port, path) for name, port in ports.items()}


def p50s(samples: Samples) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def span(values: list[float]) -> str:
    return f"[{min(values):.3f}-{max(values):.3f}]"


class Ratios:
    """Per launch, a ratio of two servers' p50s measured side by side in that launch (the
    neighbours); the figure is the median over launches, the range in brackets, as
    ``failing_path.py`` takes its figures: a process's own draw moves one launch, not the
    median."""

    def __init__(self) -> None:
        self.by_title: dict[str, list[float]] = {}
        self.p50s: dict[str, list[float]] = {}

    def add(self, title: str, p50: dict[str, float], ours: str, baseline: str) -> None:
        self.by_title.setdefault(title, []).append(p50[ours] / p50[baseline])
        for name in (ours, baseline):
            self.p50s.setdefault(f"{title} {name}", []).append(p50[name])

    def check(self, title: str, ours: str, baseline: str, target: float, *, either_way: bool = False) -> bool:
        ratios = self.by_title[title]
        ratio = statistics.median(ratios)
        met = abs(ratio - 1) <= target - 1 if either_way else ratio <= target
        aim = f"within {target - 1:.0%} either way" if either_way else f"<= {target:.2f}x"
        ours_us = statistics.median(self.p50s[f"{title} {ours}"]) * 1e6
        baseline_us = statistics.median(self.p50s[f"{title} {baseline}"]) * 1e6
        print(
            f"{title}: {ours_us:.2f} us vs {baseline_us:.2f} us -> ratio {ratio:.3f}x {span(ratios)} over "
            f"{len(ratios)} launches (target {aim}) " + ("ok" if met else "OVER TARGET")
        )
        return met


def main(requests: int = 3500, launches: int = LAUNCHES) -> bool:
    os.sched_setaffinity(0, CLIENT_CPUS)
    variants = {
        "ng_otel": ("ng_otel", {}),
        "plain": ("plain", {}),
        "minimum": ("minimum", {}),
        "with": ("together:plain,ng_otel", {}),  # plain and ng_otel in one process
        "off": ("together:plain,off", {"NG_OTEL_ENABLED": "0"}),  # plain and switched off in one
    }
    ratios = Ratios()
    each = requests // launches
    for _ in range(launches):
        apart_ok: Samples = {}
        chain: Samples = {}
        together: dict[str, Samples] = {}  # by process and path, e.g. "with ok"
        with running(variants) as ports:
            apart = {name: ports[name] for name in ("ng_otel", "plain", "minimum")}
            timed_in_turn(on({name: apart[name] for name in ("ng_otel", "plain")}, "/ok"), each, apart_ok)
            timed_in_turn(on(apart, "/chain"), each, chain)
            for process, twin in (("with", "ng_otel"), ("off", "off")):
                for path in ("ok", "chain"):
                    routes = {name: (ports[process], f"/{name}/{path}") for name in ("plain", twin)}
                    timed_in_turn(routes, each, together.setdefault(f"{process} {path}", {}))
        ratios.add(HEALTHY, p50s(together["with ok"]), "ng_otel", "plain")
        ratios.add(HEALTHY_APART, p50s(apart_ok), "ng_otel", "plain")
        ratios.add(CHAIN, p50s(chain), "ng_otel", "minimum")
        ratios.add(CHAIN_PLAIN, p50s(chain), "ng_otel", "plain")
        ratios.add(MINIMUM_PLAIN, p50s(chain), "minimum", "plain")
        ratios.add(OFF_HEALTHY, p50s(together["off ok"]), "off", "plain")
        ratios.add(OFF_CHAIN, p50s(together["off chain"]), "off", "plain")
    ok = ratios.check(HEALTHY, "ng_otel", "plain", HEALTHY_TARGET)
    apart_ratios = ratios.by_title[HEALTHY_APART]
    print(f"  for scale, each in its own process: {statistics.median(apart_ratios):.3f}x {span(apart_ratios)}")
    ok &= ratios.check(CHAIN, "ng_otel", "minimum", CHAIN_TARGET)
    scale = {title: statistics.median(ratios.by_title[title]) for title in (CHAIN_PLAIN, MINIMUM_PLAIN)}
    print(
        f"  for scale, against plain (no report at all): ng_otel {scale[CHAIN_PLAIN]:.2f}x, "
        f"the hand-written minimum {scale[MINIMUM_PLAIN]:.2f}x"
    )
    ok &= ratios.check(OFF_HEALTHY, "off", "plain", OFF_TARGET, either_way=True)
    ok &= ratios.check(OFF_CHAIN, "off", "plain", OFF_TARGET, either_way=True)
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pin(CLIENT_CPUS),
        cwd=HERE,  # not the repository root, whose ng_otel would shadow PYTHONPATH
    )
    try:
        live = receiver.stdout.readline().strip() if receiver.stdout else ""
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
        exporting = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        }
        variants = {
            "live": ("exporting", {**exporting, "OTEL_EXPORTER_OTLP_ENDPOINT": live}),
            "dead": ("exporting", {**exporting, "OTEL_EXPORTER_OTLP_ENDPOINT": dead}),
        }
        for _ in range(launches):
            fault_samples: Samples = {}
            with running(variants) as ports:
                timed_in_turn(on(ports, "/chain"), requests // launches, fault_samples)
            ratios.add(DEAD, p50s(fault_samples), "dead", "live")
        ok &= ratios.check(DEAD, "dead", "live", DEAD_TARGET)
    finally:
        receiver.terminate()
        receiver.wait(timeout=15)
    return ok


RECEIVER = (
    "import time; from ng_otel.cli.receiver import OtlpReceiver; r = OtlpReceiver().start(); "
    "print(r.http_endpoint, flush=True); time.sleep(3600)"
)


@contextmanager
def running(variants: dict[str, tuple[str, dict[str, str]]]) -> Iterator[dict[str, int]]:
    servers = {name: start(variant, env) for name, (variant, env) in variants.items()}
    try:
        ports = {name: port for name, (_, port, _) in servers.items()}
        for name, port in ports.items():
            wait_ready(port, "/plain/ok" if variants[name][0].startswith("together:") else "/ok")
        yield ports
    finally:
        for process, _, sock in servers.values():
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
            sock.close()


if __name__ == "__main__":
    sys.exit(0 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 3500) else 1)
