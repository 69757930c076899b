"""`opentelemetry-instrument` with no ng_otel code in the app: the entry point does it all."""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ng_otel.contract import FailureReport
from tests.conftest import wait_until

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


@pytest.mark.e2e
def test_opentelemetry_instrument_enables_the_middleware_and_client_hook(tmp_path: Path, otlp, installed):
    script = tmp_path / "app.py"
    script.write_text(APP)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {
        **installed.env(),
        "NG_OTEL_ENABLED": "1",
        "OTEL_SERVICE_NAME": "auto-app",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    # From a folder of its own, with ng_otel installed from its wheel: what a user runs.
    process = subprocess.Popen(
        [installed.bin("opentelemetry-instrument"), installed.bin("python"), "app.py", str(sock.fileno())],
        pass_fds=(sock.fileno(),),
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )
    try:

        def healthy():
            assert process.poll() is None, process.stderr.read().decode()
            return get(f"{url}/health")[0] == 200

        wait_until(healthy, 30, "the instrumented app to answer /health", ignoring=(OSError,))
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


# A FastAPI app with a catch-all middleware (as NeMo Gym's), after the named instrumentors ran
# in the given order; prints the reply and the exported spans' failure events.
ORDER_APP = """
import asyncio, json, sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from ng_otel.instrumentor import NgOtelInstrumentor

steps = {"fastapi": FastAPIInstrumentor, "ng_otel": NgOtelInstrumentor}
for name in sys.argv[1].split(","):
    steps[name]().instrument()

import fastapi
from fastapi.responses import JSONResponse
from ng_otel import NgFailureEvent

app = fastapi.FastAPI()

@app.middleware("http")
async def catch_all(request, call_next):
    try:
        return await call_next(request)
    except Exception as e:
        return JSONResponse(content=repr(e), status_code=500)

@app.get("/fail")
async def fail():
    raise NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)

async def call(path):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "headers": [(b"host", b"test")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent = []
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    async def send(message):
        sent.append(message)
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}

status, headers = asyncio.run(call("/fail"))
spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "events": [e.attributes["ng.failure.kind"] for e in s.events if e.name == "ng.failure"],
    }
    for s in exporter.get_finished_spans()
]
print(json.dumps({"status": status, "report": "x-ng-failure-report" in headers, "spans": spans}))
"""


def run_order_app(order: str, tmp_path: Path, **variables: str) -> dict:
    (tmp_path / "order_app.py").write_text(ORDER_APP)
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("NG_OTEL_")},
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        **variables,
    }
    done = subprocess.run(
        [sys.executable, "order_app.py", order], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "order",
    [
        pytest.param("fastapi,ng_otel", id="contrib-fastapi-first"),
        pytest.param("ng_otel,fastapi", id="ng_otel-first"),
        pytest.param(
            "ng_otel",
            id="fastapi-native-telemetry",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("fastapi.telemetry") is None,
                reason="this FastAPI has no native telemetry (it came after 0.115)",
            ),
        ),
    ],
)
def test_the_failure_is_recorded_on_the_server_span_whatever_order_the_instrumentors_load_in(order, tmp_path):
    # OpenTelemetry's FastAPI instrumentor replaces the name fastapi.FastAPI with a subclass;
    # without it, FastAPI's own native telemetry makes the server span.
    result = run_order_app(order, tmp_path)
    assert result["status"] == 500 and result["report"]  # the catch-all's own reply, with the report
    servers = [span for span in result["spans"] if span["kind"] == "SERVER"]
    assert [span["events"] for span in servers] == [["transport_timeout"]]
    assert all(not span["events"] for span in result["spans"] if span["kind"] != "SERVER")


@pytest.mark.parametrize("order", ["fastapi,ng_otel", "ng_otel,fastapi"])
def test_the_asgi_send_and_receive_spans_are_left_out_unless_asked_for(order, tmp_path):
    # 4 of every 5 spans a Gym rollout exported, and no variable of FastAPI's leaves them out.
    def internal(**variables: str) -> list[str]:
        return [s["name"] for s in run_order_app(order, tmp_path, **variables)["spans"] if s["kind"] == "INTERNAL"]

    assert internal() == []
    kept = internal(NG_OTEL_SEND_RECEIVE_SPANS="1")
    assert kept and all(name.endswith(("http send", "http receive")) for name in kept)
