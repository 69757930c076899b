"""The benchmark's server: the same FastAPI app, with or without ng_otel (argv[2]), or with
the least any implementation of the contract must do for a failing reply, written by hand."""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode

from ng_otel import NgFailureEvent


def minimum_handler() -> object:
    """What every failing reply costs at least: the chain's records, one span event each with
    the contract's attributes, the span's error, a count per event, both reply headers and the
    JSON body. No index, no log, no guard, no classification rules: a floor, not an
    alternative."""
    import orjson

    from ng_otel.contract import failure_report_for

    counts: dict[tuple[str, str], int] = {}

    async def answer(request: Request, error: NgFailureEvent) -> Response:
        report = failure_report_for(error)
        assert report is not None and report.failure_id is not None
        span = trace.get_current_span()
        context = span.get_span_context()
        where = f"{context.trace_id:032x}-{context.span_id:016x}"
        for record in reversed(report.chain()):
            attributes = {
                "ng.failure.id": record["event_id"],
                "ng.failure.boundary": record["boundary"],
                "ng.failure.kind": record["failure_kind"],
                "ng.failure.reason": record["failure_reason"],
                "ng.failure.recovered": False,
                "ng.failure.class": "infra",
            }
            for key, name in (("cause_id", "ng.failure.cause_id"), ("stage", "ng.failure.stage")):
                if key in record:
                    attributes[name] = record[key]
            if "http_status" in record:
                attributes["http.response.status_code"] = record["http_status"]
            span.add_event("ng.failure", attributes)
            key = (record["boundary"], record["failure_kind"])
            counts[key] = counts.get(key, 0) + 1
        failure = report.events[report.failure_id]
        span.set_attribute("error.type", failure["failure_kind"])
        span.set_status(StatusCode.ERROR, failure["failure_kind"])
        headers = {
            "X-NG-Failure-Report": report.to_header(),
            "X-NG-Failure-Context": orjson.dumps(dict.fromkeys(report.events, where)).decode(),
        }
        body = orjson.dumps({"failure": failure})
        status = failure.get("http_status") or 500
        return Response(body, status_code=status, headers=headers, media_type="application/json")

    return answer


def build(with_ng_otel: bool, exporting: bool = False, minimum: bool = False) -> FastAPI:
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
    elif minimum:
        FastAPIInstrumentor.instrument_app(app)
        app.add_exception_handler(NgFailureEvent, minimum_handler())  # type: ignore[arg-type]
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
    variant = sys.argv[2]
    app = build(variant in ("ng_otel", "exporting"), exporting=variant == "exporting", minimum=variant == "minimum")
    try:
        asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False)).serve(sockets=[sock]))
    except KeyboardInterrupt:  # SIGINT is how the parent stops us; atexit then flushes telemetry
        pass
