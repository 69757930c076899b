"""aiohttp: the client hook, ``raise_boundary_failure``, and the server middleware.

Client:

    session = aiohttp.ClientSession(trace_configs=[failure_trace_config(boundary="harness")])
    async with session.post(url, json=body) as response:
        await raise_boundary_failure(response)   # the callee's failure, ids and causes kept

Server: ``web.Application(middlewares=[failure_report_middleware])``. The server half loads
``aiohttp.web`` (~4,900 objects every full garbage collection walks), so a process that only
calls out, a FastAPI Gym server, imports it only when it asks for the middleware.
"""

from __future__ import annotations

import functools
import time
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from aiohttp import (
    ClientResponse,
    ClientResponseError,
    ClientSession,
    TraceConfig,
    TraceRequestEndParams,
    TraceRequestExceptionParams,
    TraceRequestStartParams,
)
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from ng_otel.contract.events import ForeignError, NgFailureEvent, bound_text
from ng_otel.contract.header import REPORT_HEADER
from ng_otel.contract.report import FailureReport, rebuild_failure
from ng_otel.integrations import Patch
from ng_otel.integrations._exchange import observe_reply
from ng_otel.integrations.hooks import rules
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.failure_log import current_failure_log
from ng_otel.otel.providers import settle_providers
from ng_otel.otel.recorder import get_recorder, is_enabled
from ng_otel.otel.recovery import current_loop, keep_last_attempt
from ng_otel.otel.replies import ReplyEvidence, attach_reply

_OBSERVED = "_ng_otel_report"
_EVIDENCE = "_ng_otel_evidence"
TRACEPARENT = "traceparent"
# (method and URL, failed attempts in a row) of this task's last failed request: a retry loop
# sends the same request again from the same task, so the count is its resend count.
_last_failure: ContextVar[tuple[str, int] | None] = ContextVar("ng_otel_last_failed_request", default=None)


@dataclass(frozen=True)
class HttpError:
    """This hop's own reply, kept apart from the rebuilt remote failure."""

    status: int
    reason: str | None
    body: bytes
    url: str


def failure_trace_config(boundary: str | None = None) -> TraceConfig:
    """A ``TraceConfig`` for a client session: each request carries the caller's W3C trace
    context (unless something already put a ``traceparent`` on it, so there is never a
    second); a request made outside any span gets a CLIENT span of its own, so the callee
    joins its trace; both failure headers of every reply are read; and each attempt that
    fails without a reply (a dropped connection, a timeout) is one recovered ``ng.failure``
    event with its ``http.request.resend_count``, on a short span that ends with the attempt,
    where a transport rule is registered (NeMo Gym's retry loop resends such requests).
    ``boundary`` is this caller's (default: the registered one, else ``harness``)."""

    async def on_request_start(
        session: ClientSession, context: SimpleNamespace, params: TraceRequestStartParams
    ) -> None:
        _start(context, params)

    async def on_request_end(session: ClientSession, context: SimpleNamespace, params: TraceRequestEndParams) -> None:
        _end(context, params.response, boundary or rules.client_boundary)

    async def on_request_exception(
        session: ClientSession, context: SimpleNamespace, params: TraceRequestExceptionParams
    ) -> None:
        _failed_attempt(context, params, boundary or rules.client_boundary)

    config = TraceConfig()
    config.on_request_start.append(on_request_start)
    config.on_request_end.append(on_request_end)
    config.on_request_exception.append(on_request_exception)
    return config


@guarded
def _start(context: SimpleNamespace, params: TraceRequestStartParams) -> None:
    if not is_enabled():
        return
    context.ng_otel_start = time.time_ns()
    if TRACEPARENT in params.headers:  # Gym's own telemetry or contrib's instrumentation carried it
        return
    propagate.inject(params.headers)  # the current context: the handler's server span
    # A traceparent written says the current span is valid, without reading it a second time.
    if TRACEPARENT in params.headers or trace.get_current_span().get_span_context().is_valid:
        return
    span = get_recorder().tracer.start_span(
        params.method, kind=SpanKind.CLIENT, attributes=_request_attributes(params.method, _without_query(params.url))
    )
    context.ng_otel_span = span
    propagate.inject(params.headers, context=trace.set_span_in_context(span))
    loop = current_loop()  # a request outside any span (collection's /run): its loop keeps the span
    if loop is not None:
        loop.span_context = span.get_span_context()


@guarded
def _end(context: SimpleNamespace, response: ClientResponse, boundary: str) -> None:
    report = _observe(response, boundary)
    if _last_failure.get() is not None:
        _last_failure.set(None)  # answered: a later failure of the same request starts a new count
        loop = current_loop()
        if loop is not None:  # the attempt that answered after failed ones: where the retry delay ends
            loop.attempt_started(getattr(context, "ng_otel_start", 0))
    span = getattr(context, "ng_otel_span", None)
    if response.status >= 400:
        where = span if span is not None else trace.get_current_span()
        try:
            setattr(response, _EVIDENCE, ReplyEvidence(response.status, report, where.get_span_context()))
        except AttributeError:
            pass
    if span is not None:
        span.set_attribute(names.HTTP_STATUS, response.status)
        span.end()


@guarded
def _failed_attempt(context: SimpleNamespace, params: TraceRequestExceptionParams, boundary: str) -> None:
    span = getattr(context, "ng_otel_span", None)
    if span is not None:
        span.end()
    kind = rules.transport_kind(params.exception) if rules.transport_kind is not None else None
    if kind is None or not is_enabled():
        return
    url = _without_query(params.url)  # a yarl URL formats itself anew on every str()
    request = f"{params.method} {url}"
    last = _last_failure.get()
    resend_count = last[1] + 1 if last is not None and last[0] == request else 0
    _last_failure.set((request, resend_count))
    started = getattr(context, "ng_otel_start", None)
    event_attributes: dict[str, Any] = {names.RESEND_COUNT: resend_count}
    loop = current_loop()
    retried = True
    if loop is not None:  # a known retry loop (Gym's): its count, and whether it sends again
        resend_count, retried = loop.attempt_failed(kind, params.exception, started)
        event_attributes = {names.RESEND_COUNT: resend_count, names.RETRY_EXHAUSTED: not retried}
    foreign = ForeignError.from_exception(params.exception)
    reason = bound_text(f"{request}: {foreign.type.rsplit('.', 1)[-1]}: {foreign.message}")
    event = NgFailureEvent(kind, reason, boundary=boundary, foreign_error=foreign)
    report = FailureReport._trusted({event.event_id: event.to_record()})
    recorder = get_recorder()
    attempt = recorder.tracer.start_span(
        names.LATE_SPAN_PREFIX + kind,
        context=None if span is None else trace.set_span_in_context(span),  # None: the current span's
        start_time=started,
        attributes={**_request_attributes(params.method, url), **event_attributes},
    )
    try:
        # The attempt that ends the loop is on the chain of what the caller raises next.
        recorder.record(report, attempt, own=False, recovered=retried, event_attributes=event_attributes)
    finally:
        attempt.end()
    if not retried:
        keep_last_attempt(params.exception, report)
    log = current_failure_log()
    if log is not None:
        log.add(report, own=False)


def _request_attributes(method: str, url: str) -> dict[str, Any]:
    return {names.HTTP_METHOD: method, names.URL_FULL: url}


def _without_query(url: Any) -> str:
    return str(url).split("?", 1)[0]


@guarded
def attach_reply_evidence(response: ClientResponse, error: ClientResponseError) -> None:
    """Put what the failed ``response`` said on the ``error`` raised for it."""
    evidence = getattr(response, _EVIDENCE, None)
    if isinstance(evidence, ReplyEvidence):
        attach_reply(error, evidence)


def reply_report(response: ClientResponse, *, boundary: str = "harness") -> FailureReport | None:
    """The report a reply carried (decoded once per response), or ``None``."""
    return _observe(response, boundary)


def _observe(response: ClientResponse, boundary: str) -> FailureReport | None:
    cached = getattr(response, _OBSERVED, None)
    if cached is not None:
        return cached if isinstance(cached, FailureReport) else None
    # Most replies carry no report: one lookup says so, without observe_reply's call and guard.
    report = observe_reply(response.headers.get, boundary) if REPORT_HEADER in response.headers else None
    try:
        setattr(response, _OBSERVED, report if report is not None else False)
    except AttributeError:  # a response type with slots: reading twice is idempotent anyway
        pass
    return report


async def raise_boundary_failure(response: ClientResponse, *, boundary: str = "harness") -> None:
    """Raise the callee's failure, rebuilt with its event ids and explicit causes, when the
    reply failed and carries a report; its ``http_error`` holds this hop's status and body.
    A failed reply without a usable report raises ``ClientResponseError`` as
    ``raise_for_status`` would. A successful reply returns."""
    report = reply_report(response, boundary=boundary)
    if response.status < 400:
        return
    body = await response.read()
    failure = rebuild_failure(report) if report is not None else None
    if failure is None:
        response.raise_for_status()
        return
    failure.http_error = HttpError(response.status, response.reason, body, str(response.url))
    raise failure


def __getattr__(name: str) -> Any:
    if name == "failure_report_middleware":
        from ng_otel.integrations._aiohttp_server import failure_report_middleware

        return failure_report_middleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def patch_framework(patch: Patch) -> None:
    """The no-code path: every ``ClientSession`` gets the failure trace config, and
    ``ClientResponse.raise_for_status`` (what Gym's request helpers call) keeps what the
    reply said on the ``ClientResponseError`` it raises."""

    def make_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, trace_configs: Any = None, **kwargs: Any) -> None:
            settle_providers()  # a process without a web app (collection) has run Gym's set-up by now
            configs = list(trace_configs or [])
            configs.append(failure_trace_config())
            original(self, *args, trace_configs=configs, **kwargs)

        return __init__

    def make_raise_for_status(original: Any) -> Any:
        @functools.wraps(original)
        def raise_for_status(self: Any) -> None:
            try:
                original(self)
            except ClientResponseError as error:
                attach_reply_evidence(self, error)  # what the reply said, for the failure raised above
                raise

        return raise_for_status

    patch(ClientSession, "__init__", make_init)
    patch(ClientResponse, "raise_for_status", make_raise_for_status)
