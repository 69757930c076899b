"""p50 latency, one request at a time, of the same app (OpenTelemetry's FastAPI instrumentation,
uvicorn on uvloop and httptools) plain, with ng_otel, with ng_otel switched off
(``NG_OTEL_ENABLED=0``), and with the hand-written minimum of what the contract adds to a
failing reply (``_latency_app.minimum_handler``); each server its own process, all called
alternately from this one. Then the same app with ng_otel exporting to a live OTLP receiver vs
to a dead endpoint.

Targets: a request with no failure at most 1.01x plain; a reply carrying a three-event chain
at most 1.03x the hand-written minimum; switched off, within 1 % of plain either way (healthy
and failing); failing requests with the collector dead vs alive at most 1.10x. The chain
against plain is printed for scale.
Run: .venv/bin/python bench/latency.py [requests per variant, default 3000, over 3 launches]
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

from _measure import report  # noqa: E402
from _procs import turn_order  # noqa: E402

# Both servers share one core and the client has the other: requests are sequential, so the
# servers never compete, and no process migrates between cores mid-measurement.
CPUS = sorted(os.sched_getaffinity(0))
CLIENT_CPUS, SERVER_CPUS = ({CPUS[0]}, {CPUS[-1]}) if len(CPUS) > 1 else (set(CPUS), set(CPUS))


# Each measurement runs in fresh sets of server processes, its samples pooled: two processes of
# the same code differ here per launch (two plain servers read 0.95-1.26 of each other in four
# launches; the same hash seed in all of them did not narrow it).
LAUNCHES = 3


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


def wait_ready(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/ok")
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


def timed_in_turn(path: str, ports: dict[str, int], requests: int, samples: Samples) -> None:
    """``requests`` of ``path`` to each server, the servers in turn; each latency appended
    to ``samples`` under its server's name (so launches pool into one list per server)."""
    clients = {name: KeepAliveClient(port) for name, port in ports.items()}
    names = list(ports)
    for index in range(requests + 200):
        for name in turn_order(names, index):  # every server takes every place equally often
            start = time.perf_counter()
            clients[name].get(path)
            elapsed = time.perf_counter() - start
            if index >= 200:  # warm-up
                samples.setdefault(name, []).append(elapsed)


def p50s(samples: Samples) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def same(title: str, ours: float, baseline: float, noise: float = 0.01) -> bool:
    ratio = ours / baseline
    met = abs(ratio - 1) <= noise
    print(
        f"{title}: {ours * 1e6:.2f} us vs {baseline * 1e6:.2f} us -> ratio {ratio:.3f}x "
        f"(target: indistinguishable, within {noise:.0%} either way) {'ok' if met else 'DIFFERS'}"
    )
    return met


def main(requests: int = 3000, launches: int = LAUNCHES) -> bool:
    os.sched_setaffinity(0, CLIENT_CPUS)
    variants = {
        "ng_otel": ("ng_otel", {}),
        "plain": ("plain", {}),
        "off": ("off", {"NG_OTEL_ENABLED": "0"}),
        "minimum": ("minimum", {}),
    }
    healthy_samples: Samples = {}
    chain_samples: Samples = {}
    for _ in range(launches):
        with running(variants) as ports:
            healthy_ports = {name: ports[name] for name in ("ng_otel", "plain", "off")}
            timed_in_turn("/ok", healthy_ports, requests // launches, healthy_samples)
            timed_in_turn("/chain", ports, requests // launches, chain_samples)
    healthy, chain = p50s(healthy_samples), p50s(chain_samples)
    ok = report("p50 latency, no failure, ng_otel vs plain", healthy["ng_otel"], healthy["plain"], target=1.01)
    ok &= report(
        "p50 latency, reply with a 3-event chain, ng_otel vs the hand-written minimum",
        chain["ng_otel"],
        chain["minimum"],
        target=1.03,
    )
    print(
        f"  for scale, against plain (no report at all): ng_otel {chain['ng_otel'] / chain['plain']:.2f}x, "
        f"the hand-written minimum {chain['minimum'] / chain['plain']:.2f}x"
    )
    ok &= same("p50 latency, no failure, switched off vs plain", healthy["off"], healthy["plain"])
    ok &= same("p50 latency, 3-event chain, switched off vs plain", chain["off"], chain["plain"])
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
        fault_samples: Samples = {}
        for _ in range(launches):
            with running(variants) as ports:
                timed_in_turn("/chain", ports, requests // launches, fault_samples)
        faults = p50s(fault_samples)
        ok &= report(
            "p50 latency of failing requests, collector dead vs alive", faults["dead"], faults["live"], target=1.10
        )
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
        for port in ports.values():
            wait_ready(port)
        yield ports
    finally:
        for process, _, sock in servers.values():
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
            sock.close()


if __name__ == "__main__":
    sys.exit(0 if main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000) else 1)
