"""aiohttp: the client hook, ``raise_boundary_failure``, and the server middleware.

Client:

    session = aiohttp.ClientSession(trace_configs=[failure_trace_config(boundary="harness")])
    async with session.post(url, json=body) as response:
        await raise_boundary_failure(response)   # the callee's failure, ids and causes kept

Server: ``web.Application(middlewares=[failure_report_middleware])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from aiohttp import ClientResponse, ClientSession, TraceConfig, TraceRequestEndParams, web

from ng_otel.contract.report import FailureReport, rebuild_failure
from ng_otel.integrations._exchange import failure_reply, observe_reply, reply_headers
from ng_otel.otel.failure_log import close_failure_log, open_failure_log
from ng_otel.otel.recorder import is_enabled, record_failure

_OBSERVED = "_ng_otel_report"


@dataclass(frozen=True)
class HttpError:
    """This hop's own reply, kept apart from the rebuilt remote failure."""

    status: int
    reason: str | None
    body: bytes
    url: str


def failure_trace_config(boundary: str = "harness") -> TraceConfig:
    """A ``TraceConfig`` that reads both failure headers of every reply. ``boundary`` is this
    caller's, used for a ``protocol_violation`` when a peer's header is malformed."""

    async def on_request_end(session: ClientSession, context: SimpleNamespace, params: TraceRequestEndParams) -> None:
        _observe(params.response, boundary)

    config = TraceConfig()
    config.on_request_end.append(on_request_end)
    return config


def reply_report(response: ClientResponse, *, boundary: str = "harness") -> FailureReport | None:
    """The report a reply carried (decoded once per response), or ``None``."""
    return _observe(response, boundary)


def _observe(response: ClientResponse, boundary: str) -> FailureReport | None:
    cached = getattr(response, _OBSERVED, None)
    if cached is not None:
        return cached if isinstance(cached, FailureReport) else None
    report = observe_reply(response.headers.get, boundary)
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


@web.middleware
async def failure_report_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """The aiohttp server twin of the ASGI middleware (streamed replies are not annotated)."""
    if not is_enabled():
        return await handler(request)  # type: ignore[no-any-return]
    log, token = open_failure_log()
    try:
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as http_exception:
            response = http_exception
        except Exception as error:
            answer = failure_reply(error)
            if answer is None:
                raise
            status, body, report = answer
            record_failure(report)
            response = web.Response(status=status, body=body, content_type="application/json")
        if not response.prepared:
            for name, value in reply_headers(log) or []:
                response.headers[name] = value
        if isinstance(response, web.HTTPException):
            raise response
        return response
    finally:
        close_failure_log(token)
