"""The throughput and memory benchmarks' server: one FastAPI app shaped like a Gym server, served
the way NeMo Gym serves it (uvicorn on uvloop and httptools), with OpenTelemetry tracing (the
contrib FastAPI instrumentation) and metrics, exporting OTLP as the ``OTEL_*`` variables say.

Variants (argv[2]): ``plain`` (A), ``ng_otel`` (B: ``ng_otel.enable()`` then ``instrument_app``)
and ``off`` (B's code with ``NG_OTEL_ENABLED=0`` set by the caller). The telemetry pipeline is
the app's own and identical in all three; ``enable()`` finds it installed and records through it.

Routes: ``POST /run`` takes ~2 KB of JSON and answers ~2 KB, or raises a three-event cause
chain (``raise ... from``) when the body says ``fail``; ``POST /hold`` does the same after
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

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import metrics, trace
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


def failure_chain(task_id: int) -> None:
    """Raise a three-event chain the way Gym code does: model timeout -> harness -> agent."""
    try:
        try:
            raise NgFailureEvent(
                "transport_timeout", f"task {task_id}: model timed out", boundary="model", http_status=504
            )
        except NgFailureEvent as model:
            raise NgFailureEvent("agent_run_error", "harness gave up", boundary="harness", stage="agent") from model
    except NgFailureEvent as harness:
        raise NgFailureEvent("agent_run_error", "rollout failed", boundary="agent", http_status=500) from harness


def answer(body: RunRequest) -> RunResponse:
    output = [Message(role="assistant", content=f"{m.content[::-1]}") for m in body.input]
    return RunResponse(task_id=body.task_id, reward=1.0, output=output, metadata=body.metadata)


def build(variant: str) -> FastAPI:
    install_telemetry(f"bench-{variant}")
    app = FastAPI()
    if variant in ("ng_otel", "off"):  # enabled first, as a server would: instrumentations after it
        import ng_otel
        from ng_otel.integrations import instrument_app

        ng_otel.enable(f"bench-{variant}")
        instrument_app(app)
    FastAPIInstrumentor.instrument_app(app)

    @app.exception_handler(NgFailureEvent)
    async def failure_reply(request: Request, error: NgFailureEvent) -> JSONResponse:
        return JSONResponse({"failure": error.to_record()}, status_code=error.http_status or 500)

    release = asyncio.Event()
    held = [0]

    @app.get("/ok")
    async def ok() -> dict[str, Any]:
        return {"ok": True, "loop": type(asyncio.get_running_loop()).__module__}

    @app.post("/run")
    async def run(body: RunRequest) -> RunResponse:
        if body.fail:
            failure_chain(body.task_id)
        return answer(body)

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
        build(sys.argv[2]),
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
