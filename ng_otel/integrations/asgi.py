"""``FailureReportMiddleware``: Gym failure reports for FastAPI and Starlette apps.

    instrument_app(app)          # or: opentelemetry-instrument, which does the same

An app's own error handling (exception handlers, a catch-all middleware such as NeMo Gym's
``setup_exception_middleware``) may turn a raised failure into a reply, so ng_otel works in
layers around it, placed when the app builds its middleware stack:

- ``FailureReportMiddleware``, outermost among the app's middleware, opens the request's
  failure log (fed by ``record_failure``, ``observe_failure`` and the aiohttp client hook) and
  adds ``X-NG-Failure-Report`` and ``X-NG-Failure-Context`` to every reply with failures,
  whoever wrote it (a ``text/event-stream`` reply gets them as a final ``ng_failure_report``
  event instead, since its headers are gone);
- a ``RaisedFailureRecorder``, innermost, and the app's exception handlers, wrapped, record a
  Gym failure where it is raised, on the server span, before anything answers it (an app
  with no middleware of its own needs no such layer: the report layer is then directly
  outside the router and records what escapes it).

Status and body stay the app's own wherever the app answers; a failure that nothing in the
app answers is answered here with its ``http_status`` (500 without one) and a JSON body.
``app.add_middleware(FailureReportMiddleware)`` works too, where nothing outside it answers.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any, Final

from opentelemetry import trace

from ng_otel._compat import exception_handlers_of
from ng_otel.integrations import Patch
from ng_otel.integrations._exchange import (
    FAILURE_HEADERS,
    adopt_app_headers,
    failure_reply,
    read_reply,
    record_escaped,
    reply_headers,
)
from ng_otel.integrations.hooks import MAX_READ_REPLY_BYTES, rules
from ng_otel.otel import names
from ng_otel.otel._guard import guarded
from ng_otel.otel.failure_log import FailureLog, close_failure_log, open_failure_log
from ng_otel.otel.providers import settle_providers
from ng_otel.otel.recorder import is_enabled, record_failure

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_log = logging.getLogger("ng_otel")
_MAX_APP_DEPTH = 64  # how far down the middleware chain to look for the router
_LOG_SCOPE_KEY = "ng_otel.failure_log"
_INNER_APP_ATTRIBUTES = ("app", "_app")  # where ASGI middleware keep the app they wrap


class FailureReportMiddleware:
    """``reply_paths``: routes whose JSON replies the registered reply reader reads (Gym's:
    ``/verify`` replies are verify outcomes); ``None``, the routes it was registered for;
    ``()`` switches it off.
    ``answer_failures=False`` leaves an escaping failure to the app's own error handler;
    ``record_raised=False`` when a ``RaisedFailureRecorder`` was placed already (by
    ``add_failure_layers``), otherwise the router below is found and one is put around it."""

    _records_escapes = False  # a RaisedFailureRecorder below records what escapes the router

    def __init__(
        self,
        app: ASGIApp,
        *,
        reply_paths: Collection[str] | None = None,
        answer_failures: bool = True,
        record_raised: bool = True,
    ) -> None:
        self.app = app
        self.reply_paths = None if reply_paths is None else frozenset(reply_paths)
        self.answer_failures = answer_failures
        if record_raised and is_enabled():  # switched off, the app stays exactly as it was
            install_raise_recorder(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_enabled():
            await self.app(scope, receive, send)
            return
        log = open_failure_log()
        if not self.answer_failures:
            scope[_LOG_SCOPE_KEY] = log  # for the app's error handler, which answers outside this layer
        paths = rules.reply_paths if self.reply_paths is None else self.reply_paths
        reply = _Reply(send, log, rules.reply_reader is not None and scope.get("path") in paths)
        try:
            await self.app(scope, receive, reply.send)
        except asyncio.CancelledError as error:
            if self._records_escapes:
                record_escaped(error)
            raise
        except Exception as error:
            if self._records_escapes:
                record_escaped(error)
            answer = failure_reply(error)
            if answer is None:
                raise
            status, body, report = answer
            record_failure(report, span=trace.get_current_span())  # the server span: this task's context
            if not self.answer_failures:
                raise  # the app's own error handler answers, with the report on its reply
            if not reply.started:
                await reply.send_failure(status, body)
            elif not await reply.finish_stream():
                # Headers and part of a body are out: the server must abort the connection. It
                # logs what is raised at ERROR, so that names the failure, never its reason.
                kind = report.chain()[0]["failure_kind"]  # the reply's own failure
                raise ReplyBroken(f"{kind} after the reply started") from None
        finally:
            if not self.answer_failures:  # the app's error handler may answer after this layer closes
                scope[_LOG_SCOPE_KEY] = log.copy()
            close_failure_log(log)


class _ReportOverRouter(FailureReportMiddleware):
    """The report layer of an app with no middleware of its own: nothing between it and the
    router answers an exception, so it records what escapes there itself, and the request
    passes one layer fewer than through a ``RaisedFailureRecorder``."""

    _records_escapes = True


class ReplyBroken(Exception):
    """A failure after the reply started: the connection is aborted; the failure itself was
    recorded and its event carries the details."""


class _Reply:
    """Forwards the app's messages, adding the report where the reply can still carry it."""

    # Class defaults, not __slots__ set in __init__: one per request, most never change.
    _held: Message | None = None  # the start of a reply to read, until its body is read
    _body: list[bytes]  # a held reply's body so far, and its size: set when a reply is held
    _held_bytes: int
    started = False
    _start_headers: Any = ()
    _stream: bool | None = None  # whether the reply is an event stream, read when it matters
    _finished = False  # the reply's last message went out

    def __init__(self, send: Send, log: FailureLog, read: bool) -> None:
        self._send = send
        self._log = log
        self._read = read  # whether the reply reader reads this reply

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._start_headers = message.get("headers", ())
            if self._read and _content_type(self._start_headers).startswith(b"application/json"):
                self._held, self._body, self._held_bytes = message, [], 0
                return
            self.started = True
            await self._send(self._with_report(message) if self._log.observed else message)
            return
        if self._held is not None and kind == "http.response.body":
            chunk = message.get("body", b"")
            self._body.append(chunk)
            self._held_bytes += len(chunk)  # a running total: a reply of many small chunks stays linear
            if message.get("more_body", False):
                if self._held_bytes > MAX_READ_REPLY_BYTES:
                    await self._release(more_body=True)
                return
            read_reply(b"".join(self._body))
            await self._release(more_body=False)
            return
        if kind == "http.response.body" and not message.get("more_body", False):
            if self._log.observed and self._is_stream():
                await self._send_report_event()
            self._finished = True
        await self._send(message)

    def _is_stream(self) -> bool:
        """A healthy reply never asks: its content type is read only for a reply with failures."""
        if self._stream is None:
            self._stream = _content_type(self._start_headers).startswith(b"text/event-stream")
        return self._stream

    def _with_report(self, message: Message) -> Message:
        """The start of a reply with failures as it leaves: with the report headers (an event
        stream carries them as its last event instead)."""
        if not self._is_stream():
            headers = message.get("headers", ())
            if any(name.lower() in _FAILURE_HEADER_NAMES for name, _ in headers):  # the app set its own
                adopt_app_headers(_header_getter(headers), self._log, rules.client_boundary, message["status"])
                headers = [(name, value) for name, value in headers if name.lower() not in _FAILURE_HEADER_NAMES]
            message = {**message, "headers": [*headers, *_encoded(reply_headers(self._log) or [])]}
        return message

    async def _release(self, *, more_body: bool) -> None:
        held, self._held = self._held, None
        if held is not None:
            self.started = True
            await self._send(self._with_report(held) if self._log.observed else held)
        body, self._body, self._held_bytes = b"".join(self._body), [], 0
        await self._send({"type": "http.response.body", "body": body, "more_body": more_body})

    async def send_failure(self, status: int, body: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": headers + _encoded(reply_headers(self._log) or []),
            }
        )
        await self._send({"type": "http.response.body", "body": body})

    async def finish_stream(self) -> bool:
        """A stream broken by a failure still ends, with its report: True when it did."""
        if not self._is_stream():
            return False
        if not self._finished:
            await self._send_report_event()
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            self._finished = True
        return True

    async def _send_report_event(self) -> None:
        lines = [
            f"event: {names.SSE_EVENT}\ndata: {value}\n\n"
            if name == names.REPORT_HEADER
            else f"event: {names.SSE_CONTEXT_EVENT}\ndata: {value}\n\n"
            for name, value in reply_headers(self._log) or []
        ]
        if lines:
            await self._send({"type": "http.response.body", "body": "".join(lines).encode("ascii"), "more_body": True})


_FAILURE_HEADER_NAMES: Final = frozenset(name.encode("ascii") for name in FAILURE_HEADERS)


def _header_getter(headers: Any) -> Callable[[str], str | None]:
    def get(name: str) -> str | None:
        wanted = name.lower().encode("ascii")
        return next((bytes(value).decode("latin-1") for key, value in headers if key.lower() == wanted), None)

    return get


def _content_type(headers: Any) -> bytes:
    for name, value in headers:
        if name.lower() == b"content-type":
            return bytes(value).lower()
    return b""


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    encoded = []
    for name, value in headers:  # a loop, not a comprehension (a call of its own): every failing reply
        encoded.append((name.lower().encode("ascii"), value.encode("ascii")))
    return encoded


class RaisedFailureRecorder:
    """Records a failure that leaves the router, on the span current there (the server span):
    a Gym failure, or any exception the registered escape rule names (in a NeMo Gym server,
    every one, as Gym's catch-all turns each into a 500). Then lets it go on: the app's own
    middleware (a catch-all such as NeMo Gym's ``setup_exception_middleware``) still answers
    it, and the reply that leaves carries its report."""

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # a lifespan cancelled at shutdown is no request's failure
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except (Exception, asyncio.CancelledError) as error:
            record_escaped(error)  # guarded; a foreign exception only where a rule says what it is
            raise


@guarded
def add_failure_layers(app: Any, **options: Any) -> None:
    """Place ng_otel's layers in a Starlette or FastAPI app about to build its middleware
    stack (its ``build_middleware_stack`` calls this first): the report layer outermost among
    the app's middleware, a ``RaisedFailureRecorder`` innermost (where the app has middleware
    of its own, which may answer a failure before the report layer sees it), and every exception handler
    recording the failure it answers. An error handler of the app's own (for ``500`` or
    ``Exception``) keeps answering, and its reply carries the report too. Idempotent."""
    if not is_enabled() or any(_is_report_layer(m.cls) for m in app.user_middleware):
        return
    from starlette.middleware import Middleware

    error_handler = next((key for key in (500, Exception) if key in app.exception_handlers), None)
    _wrap_handlers(app.exception_handlers, error_handler)
    options = {"answer_failures": error_handler is None, **options, "record_raised": False}
    if not app.user_middleware:  # directly outside the router: the report layer sees what escapes it
        app.user_middleware.insert(0, Middleware(_ReportOverRouter, **options))
        return
    app.user_middleware.insert(0, Middleware(FailureReportMiddleware, **options))
    app.user_middleware.append(Middleware(RaisedFailureRecorder))


def _is_report_layer(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, FailureReportMiddleware)


@guarded
def install_raise_recorder(app: Any) -> bool:
    """For ``FailureReportMiddleware`` added by hand: put a ``RaisedFailureRecorder`` around
    the router of ``app`` (a built middleware chain), just inside Starlette's
    ``ExceptionMiddleware``, and wrap the exception handlers it holds (its routes apply them
    before an exception leaves the router). True when both are in place."""
    node = app
    for _ in range(_MAX_APP_DEPTH):
        handlers = exception_handlers_of(node)
        if handlers is not None and hasattr(node, "app"):
            _wrap_handlers(handlers)
            if not isinstance(node.app, RaisedFailureRecorder):
                node.app = RaisedFailureRecorder(node.app)
            return True
        node = next((getattr(node, name) for name in _INNER_APP_ATTRIBUTES if hasattr(node, name)), None)
        if node is None:
            return False
    return False


def _wrap_handlers(handlers: dict[Any, Any], error_handler: Any = None) -> None:
    for key, handler in list(handlers.items()):
        if not getattr(handler, "_ng_otel_wrapped", False):
            handlers[key] = _recording(handler, report=error_handler is not None and key == error_handler)


def _recording(handler: Callable[..., Any], *, report: bool = False) -> Callable[..., Any]:
    """``handler``, recording the Gym failure it answers first. ``report``: it is the app's
    error handler, whose reply leaves outside ``FailureReportMiddleware``, so the reply gets
    the report headers here."""
    if inspect.iscoroutinefunction(handler):

        async def async_wrapper(request: Any, error: Exception) -> Any:
            record_failure(error)
            if not report:
                return await handler(request, error)
            try:
                response = await handler(request, error)
            except Exception as broken:
                return _broken_handler_reply(request, error, broken)
            return _with_report(request, response)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        def sync_wrapper(request: Any, error: Exception) -> Any:
            record_failure(error)
            if not report:
                return handler(request, error)
            try:
                response = handler(request, error)
            except Exception as broken:
                return _broken_handler_reply(request, error, broken)
            return _with_report(request, response)

        wrapper = sync_wrapper
    wrapper._ng_otel_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _broken_handler_reply(request: Any, error: Exception, broken: Exception) -> Any:
    """The app's error handler raised while answering ``error``: the reply Starlette and the
    server would send then (500, ``Internal Server Error``), with the failure's report. The
    handler's own exception is logged here, since the server now logs ``error`` instead."""
    from starlette.responses import PlainTextResponse

    _log.warning(
        "ng_otel: the app's error handler raised %s while answering %s; answered 500 with the failure's report",
        type(broken).__name__,
        type(error).__name__,
        exc_info=broken,
    )
    return _with_report(request, PlainTextResponse("Internal Server Error", status_code=500))


@guarded
def _add_report_headers(request: Any, response: Any) -> None:
    log = request.scope.get(_LOG_SCOPE_KEY)
    if log:
        for name, value in reply_headers(log) or []:
            response.headers[name] = value


def _with_report(request: Any, response: Any) -> Any:
    _add_report_headers(request, response)
    return response


def patch_framework(patch: Patch) -> None:
    """The no-code path: every Starlette app (FastAPI's included) gets ng_otel's layers when
    it builds its middleware stack, after the program's own telemetry set-up has run."""
    from starlette.applications import Starlette

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def build_middleware_stack(self: Any) -> Any:
            settle_providers()  # by now a Gym server has run its own telemetry set-up
            add_failure_layers(self)
            return original(self)

        return build_middleware_stack

    for cls in _stack_builders(Starlette):
        patch(cls, "build_middleware_stack", make)


SEND_RECEIVE_SPANS: Final = ("receive", "send")


def leave_out_send_receive_spans(patch: Patch) -> None:
    """OpenTelemetry's ASGI middleware, built without ``exclude_spans``, leaves out its
    internal ``http send`` and ``http receive`` spans (an app that passes ``exclude_spans``
    keeps its choice). Under ``opentelemetry-instrument`` nothing else can: FastAPI's
    instrumentation reads no variable for it."""
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError:
        return
    signature = inspect.signature(OpenTelemetryMiddleware.__init__)
    if "exclude_spans" not in signature.parameters:
        return  # an instrumentation too old to have them apart

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind_partial(self, *args, **kwargs)
            if bound.arguments.get("exclude_spans") is None:
                bound.arguments["exclude_spans"] = list(SEND_RECEIVE_SPANS)
            original(*bound.args, **bound.kwargs)

        return __init__

    patch(OpenTelemetryMiddleware, "__init__", make)


def _stack_builders(base: type) -> list[type]:
    """``base`` and every subclass loaded now that defines its own ``build_middleware_stack``.

    FastAPI overrides Starlette's, and OpenTelemetry's FastAPI instrumentor replaces the name
    ``fastapi.FastAPI`` with a subclass of its own; the class to patch is the one that defines
    the method, wherever the public name points and whichever instrumentor loaded first."""
    try:
        import fastapi.applications  # noqa: F401  (loads FastAPI's class, the usual subclass)
    except ImportError:
        pass
    found, pending = [], [base]
    while pending:
        cls = pending.pop()
        if "build_middleware_stack" in cls.__dict__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
