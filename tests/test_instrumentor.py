"""`opentelemetry-instrument` with no ng_otel code in the app: the entry point does it all."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ng_otel.contract import FailureReport

pytestmark = pytest.mark.e2e

APP = textwrap.dedent(
    """
    import asyncio, socket, sys
    import aiohttp, uvicorn
    from fastapi import FastAPI
    from ng_otel import NgFailureEvent

    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"ok": True}

    @app.get("/fail")
    async def fail():
        raise NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)

    @app.get("/session")
    async def session():
        async with aiohttp.ClientSession() as client:
            return {"trace_configs": len(client.trace_configs)}

    sock = socket.socket(fileno=int(sys.argv[1]))
    asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock]))
    """
)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def test_opentelemetry_instrument_enables_the_middleware_and_client_hook(tmp_path: Path, otlp):
    script = tmp_path / "app.py"
    script.write_text(APP)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    env = {
        **os.environ,
        "NG_OTEL_ENABLED": "1",
        "OTEL_SERVICE_NAME": "auto-app",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    process = subprocess.Popen(
        [str(instrument), sys.executable, str(script), str(sock.fileno())],
        pass_fds=(sock.fileno(),),
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                if get(f"{url}/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        status, headers, body = get(f"{url}/fail")
        assert status == 504 and json.loads(body)["failure"]["failure_kind"] == "transport_timeout"
        report = FailureReport.from_header(headers["x-ng-failure-report"])
        assert report.events[report.failure_id]["failure_kind"] == "transport_timeout"
        assert json.loads(get(f"{url}/session")[2]) == {"trace_configs": 2}  # OTel's aiohttp hook and ours
        assert otlp.wait_for(lambda: len(otlp.failure_events()) == 1)
        (event,) = otlp.failure_events()
        assert event["_span"]["service"] == "auto-app" and event["_span"]["name"].startswith("GET /fail")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)
        sock.close()
