"""Processes of the serving benchmarks: servers, the OTLP sink, the load generator, and what
/proc says about them (CPU seconds, peak RSS). Everything binds 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The loaded server has a core of its own; the load generator and the OTLP sink share the other.
CPUS = sorted(os.sched_getaffinity(0))
CLIENT_CPUS, SERVER_CPUS = ({CPUS[0]}, {CPUS[-1]}) if len(CPUS) > 1 else (set(CPUS), set(CPUS))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _child_setup(cpus: set[int]) -> Callable[[], None]:
    def setup() -> None:
        os.sched_setaffinity(0, cpus)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    return setup


class Server:
    """``_gym_app.py`` serving ``variant`` on a listening socket of its own; ``prefix`` runs it
    under another program (``valgrind``)."""

    def __init__(self, variant: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> None:
        self.variant = variant
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.port = self.sock.getsockname()[1]
        self.process = subprocess.Popen(
            [*prefix, sys.executable, str(HERE / "_gym_app.py"), str(self.sock.fileno()), variant],
            pass_fds=(self.sock.fileno(),),
            env=env,
            preexec_fn=_child_setup(SERVER_CPUS),
            stderr=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.variant} server exited with {self.process.returncode}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/ok")
                reply = connection.getresponse()
                if reply.status == 200 and json.loads(reply.read())["loop"].startswith("uvloop"):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.variant} server did not start on uvloop")

    def gc_seconds(self) -> float:
        """Seconds the server has spent in the cyclic garbage collector so far."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", "/gc")
            return float(json.loads(connection.getresponse().read())["seconds"])
        finally:
            connection.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.sock.close()


@contextmanager
def servers(
    specs: dict[str, tuple[str, dict[str, str]]], prefix: tuple[str, ...] = (), ready_within: float = 60
) -> Iterator[dict[str, Server]]:
    """Start a server per name, of (variant, whole environment); stop all on the way out."""
    started: dict[str, Server] = {}
    try:
        for name, (variant, env) in specs.items():
            started[name] = Server(variant, env, prefix)
        for server in started.values():
            server.wait_ready(ready_within)
        yield started
    finally:
        for server in started.values():
            server.stop()


SINK = (
    "import sys, time; from ng_otel.cli.receiver import OtlpReceiver; r = OtlpReceiver().start(); "
    "print(r.http_endpoint, flush=True); end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end: time.sleep(0.5); r.clear()"  # keeps nothing: a sink
)


@contextmanager
def otlp_sink(lifetime: float = 3600) -> Iterator[tuple[str, int]]:
    """ng_otel's OTLP receiver in its own process on the client's core: (endpoint, pid)."""
    process = subprocess.Popen(
        [sys.executable, "-c", SINK, str(lifetime)],
        cwd=HERE,  # not the repository root, whose ng_otel would shadow PYTHONPATH
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_child_setup(CLIENT_CPUS),
    )
    try:
        endpoint = process.stdout.readline().strip() if process.stdout else ""
        if not endpoint:
            raise RuntimeError("the OTLP sink did not start")
        yield endpoint, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class LoadGenerator:
    """``_load.py rate`` in its own process on the client's core, fed one window at a time."""

    def __init__(self, lifetime: float = 3600) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "_load.py"), "rate", str(lifetime)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_child_setup(CLIENT_CPUS),
        )

    def window(
        self, port: int, concurrency: int, limit: int, seconds: float, warmup: float, fail_every: int = 20
    ) -> dict[str, Any]:
        """One window of load; ``fail_every``: 1 request in N fails (1: all, 0: none)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{port} {concurrency} {limit} {seconds} {warmup} {fail_every}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited with {self.process.wait(timeout=10)}")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@contextmanager
def load_generator() -> Iterator[LoadGenerator]:
    generator = LoadGenerator()
    try:
        yield generator
    finally:
        generator.close()


def load(*args: object, timeout: float) -> dict[str, Any]:
    """Run the load generator in its own process on the client's core; its JSON result."""
    process = subprocess.Popen(
        [sys.executable, str(HERE / "_load.py"), *map(str, args)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_child_setup(CLIENT_CPUS),
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    if process.returncode:
        raise RuntimeError(f"load generator exited with {process.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def turn_order(names: list[str], index: int) -> list[str]:
    """The servers' order in round ``index``: over ``2 * len(names)`` rounds every server takes
    every place equally often. A server loaded right after another shares its core with what
    that one still does (its span processor's last export, its metric reader); with the order
    only reversed each round, the middle server always paid for it and the others half the time."""
    shift = index % len(names)
    order = names[shift:] + names[:shift]
    return order[::-1] if (index // len(names)) % 2 else order


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def event_loop_cpu_ns(pid: int) -> int:
    """Nanoseconds the process's main thread (the server's event loop) has run on a CPU, from
    ``/proc/<pid>/task/<pid>/schedstat``: fine enough to charge one request at a time, where
    ``cpu_seconds`` counts in clock ticks (10 ms)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as schedstat:
        return int(schedstat.read().split()[0])


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in KiB."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0])
    return values
