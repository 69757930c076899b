"""The benchmark's server: the same FastAPI app, with or without ng_otel (argv[2])."""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from ng_otel import NgFailureEvent


def build(with_ng_otel: bool, exporting: bool = False) -> FastAPI:
    """``exporting``: let ng_otel.enable() install providers with the OTEL_* exporters."""
    if not exporting:
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
    app = FastAPI()
    if with_ng_otel:  # enabled first, as a server would: instrumentations come after it
        import ng_otel
        from ng_otel.integrations.asgi import FailureReportMiddleware

        ng_otel.enable("bench")
        FastAPIInstrumentor.instrument_app(app)
        app.add_middleware(FailureReportMiddleware)
    else:
        FastAPIInstrumentor.instrument_app(app)

        @app.exception_handler(NgFailureEvent)
        async def plain_500(request: Request, error: NgFailureEvent) -> JSONResponse:
            return JSONResponse({"failure": error.to_record()}, status_code=error.http_status or 500)

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/chain")
    async def chain() -> None:
        model = NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)
        harness = NgFailureEvent("agent_run_error", "harness gave up", boundary="harness", stage="agent")
        harness.__cause__ = model
        agent = NgFailureEvent("agent_run_error", "rollout failed", boundary="agent", http_status=500)
        agent.__cause__ = harness
        raise agent

    return app


if __name__ == "__main__":
    sock = socket.socket(fileno=int(sys.argv[1]))
    app = build(sys.argv[2] != "plain", exporting=sys.argv[2] == "exporting")
    try:
        asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False)).serve(sockets=[sock]))
    except KeyboardInterrupt:  # SIGINT is how the parent stops us; atexit then flushes telemetry
        pass
