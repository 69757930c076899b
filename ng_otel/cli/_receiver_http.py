"""OTLP/HTTP on aiohttp's server: the receiver's HTTP side.

aiohttp parses HTTP (request line, headers, Content-Length, chunked bodies); this module adds
what a receiver of outside input needs on top of it, each bound from ``Limits``: connections
served at once (one more is answered 503), a time limit on reading a request (408 past it;
never on the work after, so a request that was stored is never answered 408), a body limit
checked on Content-Length before reading and while reading, and a budget of body bytes held
by all connections together (a body that would pass it is answered 503, which exporters
retry). aiohttp's own decompression is off: the receiver inflates a step at a time.

It is also the one room for aiohttp's parts that are not its documented surface: the
``RequestHandler`` subclass (its ``connection_made``/``connection_lost`` and ``handle_error``,
which answers what aiohttp's parser refuses). ``tests/test_receive.py`` covers each.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from concurrent import futures
from typing import TYPE_CHECKING, Any, Final

from aiohttp import StreamReader, web

if TYPE_CHECKING:
    from ng_otel.cli.receiver import Limits

_log = logging.getLogger("ng_otel.receiver")

_REFUSED: Final = b"HTTP/1.1 503 too many connections\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_OUT_OF_TIME: Final = b"HTTP/1.1 408 connection time limit\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_PROTOBUF: Final = "application/x-protobuf"

# export(signal, body parts, content encoding) -> the answer's protobuf bytes; raises
# ``Answer`` for a refusal. Runs on a worker thread.
Export = Callable[[str, list[bytes], str], bytes]


class Answer(Exception):
    """A refusal answered with ``status`` and ``message`` as plain text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BodyBudget:
    """Bytes of request bodies held at once, all connections together (the loop's thread only)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.capacity:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size


class _Connection(web.RequestHandler):
    """aiohttp's connection with the receiver's bounds: admitted only while fewer than
    ``Limits.http_connections`` are served, and given ``Limits.connection_seconds`` to deliver
    its request."""

    def __init__(self, server: HttpServer, **kwargs: Any) -> None:
        super().__init__(server.aiohttp_server, loop=server.loop, **kwargs)
        self.receiver_server = server
        self.admitted = False
        self.reading = True  # the time limit applies until the request is read or answered
        self.started = 0.0
        self.received = False  # any bytes from the client yet
        self.peer_ended = False  # the client half-closed: all it will send has arrived
        self.body_cut = False  # ... before the body it announced
        self._body: StreamReader | None = None
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self.receiver_server.admit():
            transport.write(_REFUSED)
            transport.close()
            return
        self.admitted = True
        self.started = self.receiver_server.clock()
        self._deadline = self.receiver_server.loop.call_later(
            self.receiver_server.limits.connection_seconds, self._out_of_time
        )
        super().connection_made(transport)

    def _out_of_time(self) -> None:
        if self.reading and self._transport is not None and not self._transport.is_closing():
            self._transport.write(_OUT_OF_TIME)
            self._transport.close()

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio's protocol returns bool | None
        """A client that half-closes after its request (as tests and some clients do) still
        hears the answer; a body it had not finished sending is cut there, not waited for."""
        self.peer_ended = True
        self._cut_body()
        return self.received  # keep the transport open for the answer; with nothing asked, close

    def data_received(self, data: bytes) -> None:
        self.received = True
        super().data_received(data)

    def reading_body(self, body: StreamReader) -> None:
        self._body = body
        self._cut_body()

    def _cut_body(self) -> None:
        if self.peer_ended and self._body is not None and not self._body.is_eof():
            self.body_cut = True
            self._body.feed_eof()

    def out_of_time(self) -> bool:
        """Whether reading the request took longer than the limit (on the injectable clock)."""
        return self.receiver_server.clock() - self.started > self.receiver_server.limits.connection_seconds

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.admitted:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        try:
            super().connection_lost(exc)
        finally:
            self.admitted = False
            self.receiver_server.left()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """What aiohttp's parser refuses (a request line or headers it cannot read), answered
        as text and logged at DEBUG, never as a traceback on stderr."""
        _log.debug("OTLP/HTTP request refused by the parser: %s", message, exc_info=exc)
        self.reading = False
        text = message or str(exc or "")
        if "Transfer-Encoding" in text and status == 400:
            status = 501  # RFC 9112 §6.1: a transfer coding the server does not know
        return _text(status, text or "bad request")


class HttpServer:
    """OTLP/HTTP on 127.0.0.1 (or ``host``), served from an event loop on its own thread;
    requests are handed to ``export`` on a worker thread, so the loop keeps reading others."""

    def __init__(
        self, host: str, port: int, limits: Limits, clock: Callable[[], float], paths: dict[str, str], export: Export
    ) -> None:
        self.limits = limits
        self.clock = clock
        self._paths = paths
        self._export = export
        self._budget = BodyBudget(limits.buffered_body_bytes)
        self._count = threading.Condition()
        self.connections = 0  # admitted and not yet closed
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart takes its old port
            self._sock.bind((host, port))
            self._sock.listen(128)  # the backlog: exporters that connect at once wait, not fail
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        # Threads for the work after reading: as many as connections, so a slow collector's
        # delay holds no one else; the receiver bounds the decoding itself.
        self._workers = futures.ThreadPoolExecutor(max_workers=limits.http_connections, thread_name_prefix="otlp-http")
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(
            lambda loop, context: _log.debug("OTLP/HTTP: %s", context.get("message"), exc_info=context.get("exception"))
        )
        self.aiohttp_server = web.Server(self._handle, loop=self.loop)
        self._handler_options: dict[str, Any] = {
            "auto_decompress": False,  # inflated by the receiver, a step at a time, to its limit
            "access_log": None,
            "max_field_size": limits.field_bytes,
            "lingering_time": 1.0,  # what a refused body may still send before the connection closes
        }
        self._listener: asyncio.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="otlp-http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._listener = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(timeout=30)

    async def _listen(self) -> asyncio.Server:
        return await self.loop.create_server(lambda: _Connection(self, **self._handler_options), sock=self._sock)

    # -- connections -------------------------------------------------------------------

    def admit(self) -> bool:
        with self._count:
            if self.connections >= self.limits.http_connections:
                return False
            self.connections += 1
            self._count.notify_all()
            return True

    def left(self) -> None:
        with self._count:
            self.connections -= 1
            self._count.notify_all()

    def wait_connections(self, count: int, timeout: float) -> bool:
        with self._count:
            return self._count.wait_for(lambda: self.connections == count, timeout)

    def stop(self, grace: float | None) -> bool:
        """Stop listening; with ``grace``, give the connections being served that long."""
        done = True
        if self._listener is not None:
            self.loop.call_soon_threadsafe(self._listener.close)
        if grace:
            done = self.wait_connections(0, grace)
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()
        self._sock.close()
        self._workers.shutdown(wait=False)
        return done

    async def _close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for connection in self.aiohttp_server.connections:
            connection.force_close()
            if connection.transport is not None:
                connection.transport.abort()

    # -- requests ----------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        assert isinstance(connection, _Connection)
        held = 0
        try:
            try:
                signal, encoding = self._check_head(request)
                connection.reading_body(request.content)
                parts, held = await self._read_body(request)
                if connection.out_of_time():
                    raise Answer(408, "connection time limit")
                connection.reading = False  # read in time: what follows is the receiver's work
                answer = await self.loop.run_in_executor(self._workers, self._export, signal, parts, encoding)
            finally:
                connection.reading = False
                self._budget.give_back(held)
        except Answer as refused:
            return _text(refused.status, str(refused))
        response = web.Response(body=answer, content_type=_PROTOBUF)
        response.force_close()
        return response

    def _check_head(self, request: web.BaseRequest) -> tuple[str, str]:
        signal = self._paths.get(request.path)
        if signal is None:
            raise Answer(404, "not an OTLP path")
        if request.method != "POST":
            raise Answer(405, "only POST is served")
        content_type = request.headers.get("Content-Type", _PROTOBUF).split(";", 1)[0].strip()
        if content_type != _PROTOBUF:
            raise Answer(415, "only application/x-protobuf bodies are read")
        length = request.headers.get("Content-Length")
        if length is None and "Transfer-Encoding" not in request.headers:
            raise Answer(411, "Content-Length or chunked transfer encoding is needed")
        if request.content_length is not None and request.content_length > self.limits.body_bytes:
            raise Answer(413, f"body over {self.limits.body_bytes} bytes")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity", "gzip", "deflate"):
            raise Answer(415, "only gzip and deflate bodies are decompressed")
        return signal, encoding

    async def _read_body(self, request: web.BaseRequest) -> tuple[list[bytes], int]:
        """The body in parts, and the bytes of the budget it holds (the caller gives them back)."""
        limit = self.limits.body_bytes
        held = 0
        if request.content_length:
            if not self._budget.take(request.content_length):
                raise Answer(503, "the receiver holds as many bodies as it may: try again")
            held = request.content_length
        parts: list[bytes] = []
        size = 0
        try:
            while True:
                try:
                    part = await request.content.readany()
                except Exception:  # aiohttp's word for a body cut short or malformed
                    _log.debug("OTLP/HTTP body not read", exc_info=True)
                    raise Answer(400, "the body ended early or is malformed") from None
                if not part:
                    break
                size += len(part)
                if size > limit:
                    raise Answer(413, f"body over {limit} bytes")
                if size > held:  # chunked: the budget is taken as the body arrives
                    if not self._budget.take(size - held):
                        raise Answer(503, "the receiver holds as many bodies as it may: try again")
                    held = size
                parts.append(part)
        except BaseException:
            self._budget.give_back(held)
            raise
        connection = request.protocol
        assert isinstance(connection, _Connection)
        if connection.body_cut or (request.content_length is not None and size < request.content_length):
            self._budget.give_back(held)
            raise Answer(
                400, "the body ended before Content-Length" if request.content_length else "the body ended early"
            )
        return parts, held


def _text(status: int, message: str) -> web.Response:
    response = web.Response(status=status, text=message, content_type="text/plain", charset="utf-8")
    response.force_close()
    return response


__all__ = ["Answer", "BodyBudget", "HttpServer"]
