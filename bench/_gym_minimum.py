"""The hand-written minimum of the throughput app's failing path (``_gym_app.py``, variant
``minimum``): the least any implementation of the contract adds to the app's own failure reply,
with the bare OpenTelemetry SDK, for the same events, links and reply headers ng_otel produces.

- A failed attempt of the agent's request to its model (no reply: connection refused) is one
  recovered ``ng.failure`` event with its ``http.request.resend_count`` on a short span
  ``ng.failure <kind>`` (child of the server span) that ends with the attempt.
- The model server's failure (the callee, ``/model``) is one event on its server span, the
  span's error, a count, and both reply headers.
- The agent (``/run``) reads both headers of the failed reply, rebuilds the callee's failure
  with its ids, and raises its own two events from it: one event each on its server span,
  the harness event linked (``caused_by``) to the callee's span, the span's error, a count
  per event, and both headers: the report holding the chain and the failed attempt, the
  contexts naming where each was recorded.

No link index, no failure log, no guard, no classification rules (the classes are written
in), no cardinality guard: a floor, not an alternative. The counts are a dict per label set,
reported by an observable counter as ng_otel's are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags

from ng_otel import NgFailureEvent
from ng_otel.contract import failure_report_for
from ng_otel.contract.events import ForeignError, bound_text
from ng_otel.contract.report import FailureReport, rebuild_failure

REPORT, CONTEXT = "X-NG-Failure-Report", "X-NG-Failure-Context"
_COUNTS: dict[tuple[Any, ...], int] = {}


def _observe(options: CallbackOptions) -> list[Observation]:
    return [
        Observation(
            count,
            {
                "ng.failure.boundary": b,
                "ng.failure.kind": k,
                "ng.failure.recovered": r,
                "ng.failure.class": c,
                **({"ng.failure.stage": s} if s else {}),
            },
        )
        for (b, k, r, c, s), count in list(_COUNTS.items())
    ]


def install() -> None:
    metrics.get_meter("bench-minimum").create_observable_counter("ng.failures", callbacks=[_observe], unit="{failure}")


_TRACERS: list[trace.Tracer] = []


def _tracer() -> trace.Tracer:
    if not _TRACERS:
        _TRACERS.append(trace.get_tracer("bench-minimum"))
    return _TRACERS[0]


def _where(context: SpanContext) -> str:
    return f"{context.trace_id:032x}-{context.span_id:016x}"


def _event(span: Any, record: Mapping[str, Any], recovered: bool, extra: Mapping[str, Any] | None = None) -> None:
    attributes: dict[str, Any] = {
        "ng.failure.id": record["event_id"],
        "ng.failure.boundary": record["boundary"],
        "ng.failure.kind": record["failure_kind"],
        "ng.failure.reason": record["failure_reason"],
    }
    if "cause_id" in record:
        attributes["ng.failure.cause_id"] = record["cause_id"]
    if "stage" in record:
        attributes["ng.failure.stage"] = record["stage"]
    if "http_status" in record:
        attributes["http.response.status_code"] = record["http_status"]
    foreign = record.get("foreign_error")
    if foreign is not None:
        attributes["ng.failure.foreign.type"] = foreign["type"]
        attributes["ng.failure.foreign.message"] = foreign["message"]
    attributes["ng.failure.recovered"] = recovered
    attributes["ng.failure.class"] = "infra"
    if extra:
        attributes.update(extra)
    span.add_event("ng.failure", attributes)
    key = (record["boundary"], record["failure_kind"], recovered, "infra", record.get("stage"))
    _COUNTS[key] = _COUNTS.get(key, 0) + 1


def _headers(response: JSONResponse, events: Mapping[str, Any], failure_id: str, where: Mapping[str, str]) -> None:
    report = orjson.dumps({"failure_id": failure_id, "events": events}).decode()
    contexts = orjson.dumps(where).decode()
    response.headers[REPORT] = report if len(report) <= 4096 else '{"omitted":true}'
    response.headers[CONTEXT] = contexts if len(contexts) <= 4096 else '{"omitted":true}'


def failed_attempt(error: BaseException, method: str, url: str, resend_count: int, start_ns: int) -> tuple[dict, str]:
    """One attempt that got no reply: its record and where it was recorded."""
    foreign = ForeignError.from_exception(error)
    request = f"{method} {url}"
    reason = bound_text(f"{request}: {foreign.type.rsplit('.', 1)[-1]}: {foreign.message}")
    event = NgFailureEvent("transport_unreachable", reason, boundary="agent", foreign_error=foreign)
    record = event.to_record()
    attributes = {"http.request.method": method, "url.full": url, "http.request.resend_count": resend_count}
    span = _tracer().start_span("ng.failure transport_unreachable", start_time=start_ns, attributes=attributes)
    _event(span, record, True, {"http.request.resend_count": resend_count})
    span.end()
    return record, _where(span.get_span_context())


def callee_failure(report_header: str, context_header: str) -> NgFailureEvent:
    """The failed reply's failure, rebuilt with its ids; where the callee recorded each event
    kept on it (for the cause link and the reply's context header)."""
    report = FailureReport.from_header(report_header)
    contexts = orjson.loads(context_header)
    failure = rebuild_failure(report)
    assert failure is not None
    failure.recorded_at = contexts
    return failure


def _remote(where: str) -> SpanContext:
    return SpanContext(int(where[:32], 16), int(where[33:], 16), is_remote=True, trace_flags=TraceFlags(1))


async def answer(request: Request, error: NgFailureEvent) -> JSONResponse:
    """The app's own reply (``_gym_app.failure_reply``) with the minimum's telemetry."""
    report = failure_report_for(error)
    assert report is not None and report.failure_id is not None
    span = trace.get_current_span()
    here = _where(span.get_span_context())
    events: dict[str, Any] = dict(report.events)
    where: dict[str, str] = {}
    callee: Mapping[str, str] = {}
    attempts: list[tuple[dict, str]] = getattr(request.state, "attempts", [])
    for record, attempt_where in attempts:
        events[record["event_id"]] = record
        where[record["event_id"]] = attempt_where
    for cause in report.chain():  # effect first; a callee's events carry where they were recorded
        found = getattr(_exception_of(error, cause["event_id"]), "recorded_at", None)
        if found:
            callee = found
    for record in reversed(report.chain()):  # causes first
        event_id = record["event_id"]
        if event_id in callee:
            where[event_id] = callee[event_id]  # exported by the callee: linked to, never again
            continue
        cause_id = record.get("cause_id")
        if cause_id in callee:
            attributes = {"ng.link.type": "caused_by", "ng.failure.id": event_id, "ng.failure.cause_id": cause_id}
            span.add_link(_remote(callee[cause_id]), attributes)
        _event(span, record, False)
        where[event_id] = here
    kind = report.events[report.failure_id]["failure_kind"]
    span.set_attribute("error.type", kind)
    span.set_status(StatusCode.ERROR, kind)
    response = JSONResponse({"failure": error.to_record()}, status_code=error.http_status or 500)
    _headers(response, events, report.failure_id, where)
    return response


def _exception_of(error: BaseException, event_id: str) -> BaseException | None:
    current: BaseException | None = error
    while current is not None:
        if getattr(current, "event_id", None) == event_id:
            return current
        current = current.__cause__
    return None
