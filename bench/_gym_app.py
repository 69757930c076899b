"""The throughput and memory benchmarks' server: one FastAPI app shaped like a Gym server, served
the way NeMo Gym serves it (uvicorn on uvloop and httptools), with OpenTelemetry tracing (the
contrib FastAPI instrumentation) and metrics, exporting OTLP as the ``OTEL_*`` variables say.

Variants (argv[2]): ``plain`` (A), ``ng_otel`` (B: ``ng_otel.enable()``, Gym's rules for an
agent server, then ``instrument_app``), ``off`` (B's code with ``NG_OTEL_ENABLED=0`` set by the
caller; its client injects the trace context as A's does, since ng_otel's hook switched off
injects nothing, and without it ``off`` did less than A) and ``minimum`` (A with the
hand-written minimum of the failing path, ``_gym_minimum``).
The telemetry pipeline is the app's own and identical in all; ``enable()`` finds it installed
and records through it.

Routes: ``POST /run`` takes ~2 KB of JSON and answers ~2 KB, the agent's way: it first calls
its model (``POST /model`` on this same server, over a real socket, through one keep-alive
aiohttp session carrying the W3C trace context). When the body says ``fail``, the first
attempt finds the model unreachable (connection refused: a recovered, retried attempt), the
second gets the model's failure (504, with ng_otel its report and contexts), and ``/run``
raises a three-event cause chain (``raise ... from``: model -> harness -> agent), the harness
event linked to the model's span. ``POST /hold`` answers without calling the model, after
awaiting an event that ``POST /release`` sets (``GET /held`` counts the waiting requests).
Run: python bench/_gym_app.py <listening socket fd> <variant>
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import socket
import sys
import time
from typing import Any

import _gym_minimum
import aiohttp
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import metrics, propagate, trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import BaseModel

from ng_otel import NgFailureEvent


class Message(BaseModel):
    role: str
    content: str


class RunRequest(BaseModel):
    """About the size of a Gym ``/run`` body: a task, sampling parameters, a short conversation."""

    task_id: int
    fail: bool = False
    model: str
    temperature: float
    max_output_tokens: int
    input: list[Message]
    metadata: dict[str, str]


class ModelRequest(BaseModel):
    task_id: int
    fail: bool = False


class RunResponse(BaseModel):
    task_id: int
    reward: float
    output: list[Message]
    metadata: dict[str, str]


def install_telemetry(service: str) -> None:
    """The app's own tracing and metrics pipelines, the same in every variant."""
    resource_ = Resource.create({SERVICE_NAME: service})
    tracer_provider = TracerProvider(resource=resource_)
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp") != "none":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    readers: list[MetricReader] = []
    if os.environ.get("OTEL_METRICS_EXPORTER", "otlp") != "none":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    metrics.set_meter_provider(MeterProvider(resource=resource_, metric_readers=readers))


def model_failure(task_id: int) -> NgFailureEvent:
    return NgFailureEvent("transport_timeout", f"task {task_id}: model timed out", boundary="model", http_status=504)


def agent_failure(model: BaseException) -> None:
    """Raise the agent's two events the way Gym code does: harness, then agent, from the model's."""
    try:
        raise NgFailureEvent("agent_run_error", "harness gave up", boundary="harness", stage="agent") from model
    except NgFailureEvent as harness:
        raise NgFailureEvent("agent_run_error", "rollout failed", boundary="agent", http_status=500) from harness


def failure_chain(task_id: int) -> None:
    """Raise a three-event chain in one process: model timeout -> harness -> agent."""
    try:
        raise model_failure(task_id)
    except NgFailureEvent as model:
        agent_failure(model)


def injecting_trace_config() -> aiohttp.TraceConfig:
    """The least a client carrying trace context does (A and the minimum): the W3C context of
    the current span injected into each request."""

    async def on_request_start(session: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
        propagate.inject(params.headers)

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_request_start)
    return config


class ModelClient:
    """The agent's one session to its model (Gym's ``server_utils`` keeps one per process) and
    Gym's request loop: an attempt that gets no reply is sent again."""

    def __init__(self, variant: str, port: int) -> None:
        self.variant = variant
        self.url = f"http://127.0.0.1:{port}/model"
        self._unreachable = socket.socket()  # bound, never listening: connection refused
        self._unreachable.bind(("127.0.0.1", 0))
        self.unreachable_url = f"http://127.0.0.1:{self._unreachable.getsockname()[1]}/model"
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # ng_otel's hook carries the context in B; switched off it injects nothing, so the app's own does, as in A
            configs = [] if self.variant == "ng_otel" else [injecting_trace_config()]
            if self.variant in ("ng_otel", "off"):
                from ng_otel.integrations.aiohttp import failure_trace_config

                configs.append(failure_trace_config())
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=600)
            self._session = aiohttp.ClientSession(connector=connector, trace_configs=configs)
        return self._session

    async def call(self, request: Request, task_id: int, fail: bool) -> bytes:
        session = self.session()
        data = orjson.dumps({"task_id": task_id, "fail": fail})
        attempts = []
        for attempt in range(3):
            url = self.unreachable_url if fail and attempt == 0 else self.url
            started = time.time_ns()
            try:
                async with session.post(url, data=data, headers=JSON) as reply:
                    body = await reply.read()
                    if reply.status < 400:
                        return body
                    await self.failed(reply)
            except aiohttp.ClientConnectorError as error:
                if self.variant == "minimum":
                    attempts.append(_gym_minimum.failed_attempt(error, "POST", url, attempt, started))
                    request.state.attempts = attempts
                continue
        raise RuntimeError("the model never answered")

    async def failed(self, reply: aiohttp.ClientResponse) -> None:
        if self.variant in ("ng_otel", "off"):
            from ng_otel.integrations.aiohttp import raise_boundary_failure

            await raise_boundary_failure(reply)  # the callee's failure, ids and causes kept
        elif self.variant == "minimum":
            raise _gym_minimum.callee_failure(reply.headers[_gym_minimum.REPORT], reply.headers[_gym_minimum.CONTEXT])
        reply.raise_for_status()


JSON = {"content-type": "application/json"}


def answer(body: RunRequest) -> RunResponse:
    output = [Message(role="assistant", content=f"{m.content[::-1]}") for m in body.input]
    return RunResponse(task_id=body.task_id, reward=1.0, output=output, metadata=body.metadata)


def build(variant: str, port: int = 0) -> FastAPI:
    install_telemetry(f"bench-{variant}")
    app = FastAPI()
    if variant in ("ng_otel", "off"):  # enabled first, as a server would: instrumentations after it
        import ng_otel
        from ng_otel.gym import deployment
        from ng_otel.integrations import instrument_app

        ng_otel.enable(f"bench-{variant}")
        deployment.install(deployment.GymProcess("bench_agent", "agent"))  # Gym's rules, as in an agent server
        instrument_app(app)
    FastAPIInstrumentor.instrument_app(app)
    model = ModelClient(variant, port)

    if variant == "minimum":
        _gym_minimum.install()
        app.add_exception_handler(NgFailureEvent, _gym_minimum.answer)  # type: ignore[arg-type]
    else:

        @app.exception_handler(NgFailureEvent)
        async def failure_reply(request: Request, error: NgFailureEvent) -> JSONResponse:
            return JSONResponse({"failure": error.to_record()}, status_code=error.http_status or 500)

    release = asyncio.Event()
    held = [0]

    @app.get("/ok")
    async def ok() -> dict[str, Any]:
        return {"ok": True, "loop": type(asyncio.get_running_loop()).__module__}

    @app.post("/run")
    async def run(request: Request, body: RunRequest) -> RunResponse:
        try:
            await model.call(request, body.task_id, body.fail)
        except (NgFailureEvent, aiohttp.ClientResponseError) as failed:
            agent_failure(failed)
        return answer(body)

    @app.post("/model")
    async def generate(body: ModelRequest) -> dict[str, Any]:
        if body.fail:
            raise model_failure(body.task_id)
        return {"task_id": body.task_id, "output": "The answer is 10000."}

    @app.post("/hold")
    async def hold(body: RunRequest) -> RunResponse:
        held[0] += 1
        try:
            await release.wait()
        finally:
            held[0] -= 1
        if body.fail:
            failure_chain(body.task_id)
        return answer(body)

    @app.get("/held")
    async def count() -> dict[str, int]:
        return {"held": held[0]}

    @app.get("/gc")
    async def gc_time() -> dict[str, Any]:
        return {"seconds": GC.seconds, "collections": GC.collections}

    @app.post("/release")
    async def set_free() -> dict[str, bool]:
        release.set()
        return {"released": True}

    return app


class GcClock:
    """Time this process spends in the cyclic garbage collector (``GET /gc`` reports it)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started
            self.collections[info["generation"]] += 1


GC = GcClock()


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


if __name__ == "__main__":
    raise_fd_limit()
    sock = socket.socket(fileno=int(sys.argv[1]))
    config = uvicorn.Config(
        build(sys.argv[2], sock.getsockname()[1]),
        loop="uvloop",  # uvicorn --loop uvloop --http httptools, as NeMo Gym serves
        http="httptools",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=600,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
