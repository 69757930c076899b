"""The aiohttp server middleware, ``ng_otel.integrations.aiohttp.failure_report_middleware``:
apart from the client hook, so a process that only calls out never loads ``aiohttp.web``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ng_otel.integrations._exchange import FAILURE_HEADERS, adopt_app_headers, failure_reply, read_reply, reply_headers
from ng_otel.integrations.hooks import MAX_READ_REPLY_BYTES, rules
from ng_otel.otel.failure_log import close_failure_log, open_failure_log
from ng_otel.otel.recorder import is_enabled, record_failure


def _read_reply_of(response: web.StreamResponse) -> None:
    body = getattr(response, "body", None)  # a web.Response's whole body; a stream has none to read
    if isinstance(body, bytes) and len(body) <= MAX_READ_REPLY_BYTES and response.content_type == "application/json":
        read_reply(body)


@web.middleware
async def failure_report_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """The aiohttp server twin of the ASGI middleware (streamed replies are not annotated;
    the JSON replies of the reply reader's routes are read, as the ASGI middleware reads them)."""
    if not is_enabled():
        return await handler(request)  # type: ignore[no-any-return]
    log = open_failure_log()
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
        if not response.prepared and request.path in rules.reply_paths:
            _read_reply_of(response)
        if not response.prepared and log.observed:
            adopt_app_headers(response.headers.get, log, rules.client_boundary, response.status)  # the app's own
            for name in FAILURE_HEADERS:
                response.headers.popall(name, None)
            for name, value in reply_headers(log) or []:
                response.headers[name] = value
        if isinstance(response, web.HTTPException):
            raise response
        return response
    finally:
        close_failure_log(log)
