"""The latency benchmark's server: the same FastAPI app (its own handler answers a Gym failure
with a JSON 500), plain, with ng_otel, with ng_otel switched off, or with the least any
implementation of the contract must add to a failing reply, written by hand (argv[2])."""

from __future__ import annotations

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


def plain_reply(error: NgFailureEvent) -> JSONResponse:
    """How the app answers a Gym failure, in every variant."""
    return JSONResponse({"failure": error.to_record()}, status_code=error.http_status or 500)


def minimum_handler() -> object:
    """The app's own answer plus the least the contract adds to a failing reply: the chain's
    records, one span event each with the contract's attributes, the span's error, a count
    per event, and both reply headers. No index, no log, no guard, no classification rules:
    a floor, not an alternative."""
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
        response = plain_reply(error)
        response.headers["X-NG-Failure-Report"] = report.to_header()
        response.headers["X-NG-Failure-Context"] = orjson.dumps(dict.fromkeys(report.events, where)).decode()
        return response

    return answer


def build(variant: str) -> FastAPI:
    """``plain``; ``ng_otel`` (``enable()`` then ``instrument_app``; ``off`` is the same with
    ``NG_OTEL_ENABLED=0`` in the environment, ``exporting`` lets ``enable()`` install the
    providers with the OTEL_* exporters); ``minimum``: plain with the hand-written floor."""
    if variant != "exporting":
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
    app = FastAPI()
    if variant in ("ng_otel", "off", "exporting"):  # enabled first, as a server would
        import ng_otel
        from ng_otel.integrations import instrument_app

        ng_otel.enable("bench")
        instrument_app(app)
    FastAPIInstrumentor.instrument_app(app)
    if variant == "minimum":
        app.add_exception_handler(NgFailureEvent, minimum_handler())  # type: ignore[arg-type]
    else:

        @app.exception_handler(NgFailureEvent)
        async def failure_reply(request: Request, error: NgFailureEvent) -> JSONResponse:
            return plain_reply(error)

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/chain")
    async def chain() -> None:
        try:
            try:
                raise NgFailureEvent("transport_timeout", "model timed out", boundary="model", http_status=504)
            except NgFailureEvent as model:
                raise NgFailureEvent("agent_run_error", "harness gave up", boundary="harness", stage="agent") from model
        except NgFailureEvent as harness:
            raise NgFailureEvent("agent_run_error", "rollout failed", boundary="agent", http_status=500) from harness

    return app


def together(variants: list[str]) -> object:
    """Each variant's app under ``/<variant>``, in one process: the apps then share the
    process's draw (its memory layout, what it imported), and only their code differs. Every
    app pays the same dispatch. ``off`` needs ``NG_OTEL_ENABLED=0`` in the process's
    environment, so it shares a process with ``plain`` only; ``ng_otel`` likewise."""
    apps = {f"/{variant}": build(variant) for variant in variants}
    lifespan = next(iter(apps.values()))

    async def dispatch(scope: dict, receive: object, send: object) -> None:
        if scope["type"] != "http":
            await lifespan(scope, receive, send)
            return
        prefix, _, rest = scope["path"][1:].partition("/")
        await apps["/" + prefix]({**scope, "path": "/" + rest}, receive, send)

    return dispatch


if __name__ == "__main__":
    sock = socket.socket(fileno=int(sys.argv[1]))
    kind, _, variants = sys.argv[2].partition(":")  # together:plain,off, or one variant
    app = together(variants.split(",")) if kind == "together" else build(sys.argv[2])
    # uvicorn --loop uvloop --http httptools, as NeMo Gym serves (the bench extra installs both)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", log_level="error", access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # SIGINT is how the parent stops us; atexit then flushes telemetry
        pass
