"""Start the three servers, each in its own process on a loopback socket, and stop them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StackUrls:
    model: str
    agent: str
    resources: str


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {process.returncode}")
        with suppress(OSError):
            with urllib.request.urlopen(f"{url}/health", timeout=1) as reply:
                if reply.status == 200:
                    return
        time.sleep(0.05)
    raise RuntimeError(f"server for {url} did not become healthy in {timeout:.0f}s")


@contextmanager
def gym_stack(
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    server_env: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[StackUrls]:
    """The running stack; every process it started is stopped on exit, also on error.
    ``server_env`` adds variables for one server by name (model, resources, agent)."""
    sockets = {name: _listening_socket() for name in ("model", "resources", "agent")}
    urls = {name: f"http://127.0.0.1:{sock.getsockname()[1]}" for name, sock in sockets.items()}
    child_env = {**os.environ, **(env or {})}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("model", "resources", "agent"):
            fd = sockets[name].fileno()
            command = [sys.executable, "-m", "ng_otel.cli.demo_stack.serve", name, "--fd", str(fd)]
            if name == "agent":
                command += ["--model-url", urls["model"], "--resources-url", urls["resources"]]
            output = open(log_dir / f"{name}.log", "wb") if log_dir else subprocess.DEVNULL
            own_env = {**child_env, **(server_env or {}).get(name, {})}
            processes.append(
                subprocess.Popen(command, pass_fds=(fd,), env=own_env, stdout=output, stderr=subprocess.STDOUT)
            )
        for name, process in zip(("model", "resources", "agent"), processes, strict=True):
            _wait_healthy(urls[name], process)
        yield StackUrls(model=urls["model"], agent=urls["agent"], resources=urls["resources"])
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for sock in sockets.values():
            sock.close()


def run_collection(
    agent_url: str,
    out: Path,
    env: Mapping[str, str] | None = None,
    *,
    scenarios: Sequence[str] = (),
    repeat: int = 1,
    concurrency: int = 1,
    timeout: float = 300,
) -> list[dict[str, Any]]:
    """Run rollout collection (``collect.py``) in its own process, as Gym runs it, and return
    the rows it saved to ``out``. Raises ``RuntimeError`` with its stderr if it fails."""
    command = [
        sys.executable,
        "-m",
        "ng_otel.cli.demo_stack.collect",
        "--agent-url",
        agent_url,
        "--out",
        str(out),
        "--repeat",
        str(repeat),
        "--concurrency",
        str(concurrency),
    ]
    for scenario in scenarios:
        command += ["--scenario", scenario]
    done = subprocess.run(
        command,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rollout collection failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
