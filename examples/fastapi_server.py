"""A FastAPI server that reports its Gym failures, enabled in code (no opentelemetry-instrument).

    pip install 'ng-otel[fastapi]' uvicorn
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 uvicorn fastapi_server:app   # gRPC, the default

``POST /run`` fails with a two-event chain; its reply carries ``X-NG-Failure-Report``.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

import ng_otel
from ng_otel.integrations.asgi import FailureReportMiddleware

ng_otel.enable("example-agent")  # honours OTEL_* and NG_OTEL_*; reuses providers already set
app = FastAPI()
app.add_middleware(FailureReportMiddleware)
FastAPIInstrumentor.instrument_app(app)  # optional: the server span and the trace context


async def call_model() -> None:
    await asyncio.sleep(0)
    raise TimeoutError("inference backend did not answer in 30 s")


@app.post("/run")
async def run() -> dict[str, str]:
    try:
        await call_model()
    except TimeoutError as err:
        raise ng_otel.NgFailureEvent(
            "transport_timeout", "model call timed out", boundary="model", http_status=504
        ) from err
    return {"status": "ok"}
