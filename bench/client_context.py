"""What carrying the trace context costs on each request Gym makes, against contrib's
aiohttp-client instrumentation doing the same, and what a failing Gym server's escape path
costs against the hand-written minimum.

1. CPU time of the calling process per healthy request, inside a server span (as a Gym
   handler calls the next server), for sessions with no trace config (plain), ng_otel's
   (`failure_trace_config`: context injected, reply headers read) and contrib's
   (`opentelemetry-instrumentation-aiohttp-client`: a CLIENT span and the context). The server
   runs in its own process; the variants alternate in one run. Target: ng_otel's extra CPU
   per request at most contrib's (ratio of the extras <= 1.0).
2. An exception escaping a Gym server's handler: ng_otel's escape rule and recording
   (`record_escaped`: the kind, the bounded reason and foreign error, the event, the count)
   against the minimum a hand-written adapter does for the same event (build the
   `NgFailureEvent` with its foreign error, `span.add_event` with the same attributes,
   `counter.add`). Target: at most 3x, as `bench/recorder.py`'s.

Run: .venv/bin/python bench/client_context.py
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import per_call_seconds, report

REQUESTS, ROUNDS = 400, 9


def serve(port_out: multiprocessing.connection.Connection) -> None:
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def main() -> None:
        app = web.Application()
        app.add_routes([web.post("/v1/responses", ok)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_out.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


async def client_cpu(url: str) -> dict[str, float]:
    import aiohttp
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ng_otel.integrations.aiohttp import failure_trace_config
    from ng_otel.otel.recorder import FailureRecorder, install_recorder

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = provider.get_tracer("bench")
    install_recorder(FailureRecorder(tracer, MeterProvider().get_meter("ng_otel")))
    sessions = {
        "plain": aiohttp.ClientSession(),
        "ng_otel": aiohttp.ClientSession(trace_configs=[failure_trace_config()]),
        "contrib": aiohttp.ClientSession(trace_configs=[create_trace_config(tracer_provider=provider)]),
    }
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    try:
        with tracer.start_as_current_span("POST /run"):  # the Gym handler's server span
            for round_number in range(ROUNDS + 1):
                for name, session in sessions.items():
                    start = time.process_time()
                    for _ in range(REQUESTS):
                        async with session.post(url, data=b"{}") as response:
                            await response.read()
                    if round_number:  # the first round warms connections and imports
                        samples[name].append((time.process_time() - start) / REQUESTS)
    finally:
        for session in sessions.values():
            await session.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def escape_path() -> tuple[float, float]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    from ng_otel.contract.events import ForeignError, NgFailureEvent
    from ng_otel.gym import deployment
    from ng_otel.integrations._exchange import record_escaped
    from ng_otel.otel import names
    from ng_otel.otel.recorder import FailureRecorder, install_recorder

    tracer_provider = TracerProvider(span_limits=SpanLimits(max_events=10**7, max_links=10**7))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tracer = tracer_provider.get_tracer("bench")
    install_recorder(FailureRecorder(tracer, meter_provider.get_meter("ng_otel")))
    deployment.install(deployment.GymProcess("simple_agent", "agent"))
    counter = meter_provider.get_meter("bare").create_counter(names.FAILURES_METRIC, unit=names.FAILURES_UNIT)
    error = ValueError("the model's output could not be parsed")
    span = tracer.start_span("POST /run")

    def minimum() -> None:
        foreign = ForeignError.from_exception(error)
        event = NgFailureEvent(
            "agent_run_error", f"ValueError in simple_agent: {foreign.message}", boundary="agent", foreign_error=foreign
        )
        attributes = {
            names.ID: event.event_id,
            names.BOUNDARY: event.boundary,
            names.KIND: event.failure_kind,
            names.REASON: event.failure_reason,
            names.RECOVERED: False,
            names.CLASS: "infra",
            names.HTTP_STATUS: 500,
            names.FOREIGN_TYPE: foreign.type,
            names.FOREIGN_MESSAGE: foreign.message,
        }
        span.add_event(names.EVENT, attributes)
        counter.add(1, {names.BOUNDARY: "agent", names.KIND: "agent_run_error", names.RECOVERED: False})

    from opentelemetry import trace

    def ours() -> None:
        with trace.use_span(span):
            record_escaped(error)

    timings = per_call_seconds({"ours": ours, "minimum": minimum}, number=2000, rounds=15)
    return timings["ours"], timings["minimum"]


def main() -> bool:
    receiving, sending = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=serve, args=(sending,), daemon=True)
    server.start()
    try:
        port = receiving.recv()
        cpu = asyncio.run(client_cpu(f"http://127.0.0.1:{port}/v1/responses"))
    finally:
        server.terminate()
        server.join(10)
    plain, ours, contrib = cpu["plain"], cpu["ng_otel"], cpu["contrib"]
    print(
        f"healthy request, calling process CPU: plain {plain * 1e6:.1f} us, ng_otel {ours * 1e6:.1f} us "
        f"({ours / plain:.3f}x), contrib aiohttp-client {contrib * 1e6:.1f} us ({contrib / plain:.3f}x)"
    )
    ok = report("trace context on a Gym request, extra CPU: ng_otel vs contrib", ours - plain, contrib - plain, 1.0)
    ok &= report("an exception escaping a Gym server: ng_otel vs the hand-written minimum", *escape_path(), 3.0)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
