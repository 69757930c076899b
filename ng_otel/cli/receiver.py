"""A small OTLP receiver: gRPC and HTTP/protobuf, on 127.0.0.1 unless told otherwise.

``ng-otel receive`` is this receiver in front of a terminal; ``ng-otel demo`` uses it when no
collector is configured, writing what arrives as OTLP JSON lines (the format of the
Collector's ``otlpjsonfile`` receiver); the test suite uses it as the real OTLP server the
real exporters send to. It can refuse (UNAVAILABLE / 503) to play a collector in trouble.

Whatever reaches it is outside input, so every request is bounded (``Limits``): body size,
decompressed size, time per connection, connections at once, gRPC message size. Input it
cannot read is answered 400 (gRPC: INVALID_ARGUMENT), never with a traceback.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ng_otel.otel import names

_log = logging.getLogger("ng_otel.receiver")

# The OpenTelemetry Collector's defaults: confighttp's max_request_body_size (20 MiB, which
# also bounds the decompressed body) and configgrpc's max_recv_msg_size_mib (4 MiB, gRPC's own).
MAX_BODY_BYTES = 20 * 1024 * 1024
MAX_DECOMPRESSED_BYTES = 20 * 1024 * 1024
MAX_GRPC_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_CONNECTION_SECONDS = 30.0  # from accept to the end of the answer: a slow client holds no thread longer
MAX_HTTP_CONNECTIONS = 64  # HTTP connections served at once (one thread each); more are answered 503
MAX_CHUNK_LINE_BYTES = 4096  # a chunk-size or trailer line of a chunked body

Signal = str  # "traces", "metrics" or "logs"
OnRequest = Callable[[Signal, Any], None]


@dataclass(frozen=True)
class Limits:
    """What one request may cost the receiver; the defaults are the module's constants."""

    body_bytes: int = MAX_BODY_BYTES
    decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    grpc_message_bytes: int = MAX_GRPC_MESSAGE_BYTES
    connection_seconds: float = MAX_CONNECTION_SECONDS
    http_connections: int = MAX_HTTP_CONNECTIONS
    chunk_line_bytes: int = MAX_CHUNK_LINE_BYTES


_LAYOUT = {
    "traces": ("resource_spans", "scope_spans", "spans"),
    "metrics": ("resource_metrics", "scope_metrics", "metrics"),
    "logs": ("resource_logs", "scope_logs", "log_records"),
}
_SERVICES: dict[Signal, tuple[str, Any, Any]] = {
    "traces": (
        "opentelemetry.proto.collector.trace.v1.TraceService",
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "metrics": (
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    "logs": (
        "opentelemetry.proto.collector.logs.v1.LogsService",
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
    ),
}
_HTTP_PATHS = {f"/v1/{signal}": signal for signal in _SERVICES}
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def otlp_json(message: Any) -> Any:
    """The OTLP/JSON form of a request: protobuf JSON, except that trace and span ids are hex
    strings (the OTLP JSON encoding), not base64."""
    return _hex_ids(MessageToDict(message))


def _hex_ids(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: base64.b64decode(value).hex() if key in _HEX_ID_KEYS and isinstance(value, str) else _hex_ids(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids(item) for item in node]
    return node


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return {item.key: any_value(item.value) for item in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def attributes(items: Any) -> dict[str, Any]:
    return {item.key: any_value(item.value) for item in items}


class Rejected(Exception):
    """A request the receiver answers with ``status`` instead of reading it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def decompress(data: bytes, wbits: int, limit: int) -> bytes:
    """Inflate ``data`` as a stream, a step at a time, holding at most ``limit`` bytes of output
    and one step: a gzip bomb costs the limit, never its expanded size."""
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size = 0
    pending = data
    try:
        while pending or not inflater.eof:
            part = inflater.decompress(pending, min(_INFLATE_STEP, limit + 1 - size))
            size += len(part)
            if size > limit:
                raise Rejected(413, f"decompressed body over {limit} bytes")
            if not part and not inflater.unconsumed_tail:
                break  # all input read: the end, or a truncated stream (below)
            parts.append(part)
            pending = inflater.unconsumed_tail
    except zlib.error as error:
        raise Rejected(400, f"cannot decompress the body: {error}") from None
    if not inflater.eof or inflater.unused_data:
        raise Rejected(400, "the compressed body is truncated or has trailing data")
    return b"".join(parts)


_INFLATE_STEP = 1 << 20


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}  # deflate: zlib or gzip framing


class OutOfTime(Exception):
    """A connection used up its time (``Limits.connection_seconds``)."""


class _Deadline:
    """A connection's time budget. The check uses ``clock`` (injectable, so a test can stand
    exactly at the bound); socket waits use the real monotonic clock."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self._seconds = seconds
        self._clock = clock
        self._started = clock()
        self._wait_until = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds a socket may still wait; raises ``OutOfTime`` once the budget is spent."""
        left = self._wait_until - time.monotonic()
        if self._clock() - self._started > self._seconds or left <= 0:
            raise OutOfTime
        return left


class _DeadlineSocket(io.RawIOBase):
    """The connection's read side; every read waits at most what the deadline has left."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:  # the standard library would close in silence; the client hears 408
            raise OutOfTime from None


class _Handler(BaseHTTPRequestHandler):
    """OTLP/HTTP with protobuf bodies: POST /v1/traces, /v1/metrics, /v1/logs."""

    server: _HttpServer

    def setup(self) -> None:
        self.deadline = _Deadline(self.server.limits.connection_seconds, self.server.clock)
        self.connection = self.request
        self.rfile = io.BufferedReader(_DeadlineSocket(self.connection, self.deadline))
        self.wfile = self.connection.makefile("wb", buffering=0)
        self.server.opened()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.closed()

    def handle(self) -> None:
        try:
            super().handle()
        except OutOfTime:
            self._answer_quietly(408, "connection time limit")
        except OSError:
            pass  # the client went away

    def do_POST(self) -> None:
        try:
            signal = _HTTP_PATHS.get(self.path.split("?", 1)[0])
            if signal is None:
                raise Rejected(404, "not an OTLP path")
            content_type = self.headers.get("Content-Type", "application/x-protobuf").split(";", 1)[0].strip()
            if content_type != "application/x-protobuf":
                raise Rejected(415, "only application/x-protobuf bodies are read")
            body = self._body()
            self.deadline.left()  # the whole request arrived in time
            request = _SERVICES[signal][1]()
            try:
                request.ParseFromString(body)
            except (DecodeError, RecursionError, ValueError) as error:
                raise Rejected(400, f"not an OTLP {signal} request: {error}") from None
            del body
            status = self.server.receiver.accept(signal, request)
            if status is not None:
                raise Rejected(503, status)
        except Rejected as rejected:
            self._answer(rejected.status, str(rejected).encode(), "text/plain; charset=utf-8")
            return
        self._answer(200, _SERVICES[signal][2]().SerializeToString(), "application/x-protobuf")

    def _body(self) -> bytes:
        limits = self.server.limits
        transfer = self.headers.get("Transfer-Encoding", "").strip().lower()
        if transfer:
            if transfer != "chunked":
                raise Rejected(501, "only chunked transfer encoding is read")
            body = self._chunked(limits.body_bytes, limits.chunk_line_bytes)
        else:
            length = self.headers.get("Content-Length")
            if length is None:
                raise Rejected(411, "Content-Length or chunked transfer encoding is needed")
            if not length.strip().isdigit():
                raise Rejected(400, "Content-Length is not a number")
            size = int(length)
            if size > limits.body_bytes:
                raise Rejected(413, f"body over {limits.body_bytes} bytes")
            body = self.rfile.read(size)
            if len(body) < size:
                raise Rejected(400, "the body ended before Content-Length")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding not in _WBITS:
            raise Rejected(415, "only gzip and deflate bodies are decompressed")
        return decompress(body, _WBITS[encoding], limits.decompressed_bytes)

    def _chunked(self, limit: int, line_limit: int) -> bytes:
        body = bytearray()
        while True:
            size_text = self._control_line(line_limit).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise Rejected(400, "a chunk size is not hexadecimal") from None
            if size < 0:
                raise Rejected(400, "a chunk size is negative")
            if size == 0:
                while self._control_line(line_limit).strip():
                    pass  # trailers: read and dropped
                return bytes(body)
            if len(body) + size > limit:
                raise Rejected(413, f"body over {limit} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) < size or self._control_line(line_limit).strip():
                raise Rejected(400, "a chunk ended early or without CRLF")
            body += chunk

    def _control_line(self, limit: int) -> bytes:
        line = self.rfile.readline(limit + 1)
        if len(line) > limit:
            raise Rejected(400, f"a chunk-size or trailer line over {limit} bytes")
        if not line.endswith(b"\n"):
            raise Rejected(400, "the chunked body ended early")
        return line

    def _answer(self, status: int, payload: bytes, content_type: str) -> None:
        self.connection.settimeout(self.deadline.left())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True

    def _answer_quietly(self, status: int, message: str) -> None:
        """The last word to a client out of time: a bounded, best-effort answer."""
        try:
            self.connection.settimeout(1.0)
            self.connection.sendall(
                f"HTTP/1.0 {status} {message}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a request line or headers it cannot parse)."""
        self.close_connection = True
        self.request_version = "HTTP/1.0"  # never an HTTP/0.9 answer, which has no status line
        self._answer(code, (message or "").encode("ascii", "replace"), "text/plain; charset=utf-8")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpServer(ThreadingHTTPServer):
    """The standard library's threading HTTP server with a bounded number of connections, each
    with a bounded time, and no traceback printed for a connection that goes wrong."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: exporters that connect at once wait, not fail

    def __init__(
        self, address: tuple[str, int], receiver: OtlpReceiver, limits: Limits, clock: Callable[[], float]
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.receiver = receiver
        self.limits = limits
        self.clock = clock
        self._connections = threading.Condition()
        self.connections = 0  # being served now
        self._slots = threading.BoundedSemaphore(limits.http_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        try:
            request.settimeout(0)
            request.send(b"HTTP/1.0 503 too many connections\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass
        self.shutdown_request(request)

    def opened(self) -> None:
        with self._connections:
            self.connections += 1
            self._connections.notify_all()

    def closed(self) -> None:
        with self._connections:
            self.connections -= 1
            self._connections.notify_all()

    def wait_connections(self, count: int, timeout: float) -> bool:
        with self._connections:
            return self._connections.wait_for(lambda: self.connections == count, timeout)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.debug("OTLP/HTTP connection from %s failed", client_address, exc_info=True)


class OtlpReceiver:
    """Collects every OTLP export request it receives (``keep=False``: hands each to
    ``on_request`` only, so memory stays flat however long it runs)."""

    def __init__(
        self,
        *,
        keep: bool = True,
        on_request: OnRequest | None = None,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self.keep = keep
        self.on_request = on_request
        self.limits = limits or Limits()
        self.clock = clock
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.refuse = False
        self.delay = 0.0  # seconds each export waits before it is answered: a slow collector
        self.export_calls = 0
        self.host = "127.0.0.1"
        self._grpc: grpc.Server | None = None
        self._http: _HttpServer | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, grpc_port: int = 0, http_port: int = 0, host: str = "127.0.0.1") -> OtlpReceiver:
        """Listen on ``host`` (port 0: any free port; a restarted collector passes the old
        ports). Raises ``OSError`` when a port is taken."""
        self.host = host
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-grpc"),
            handlers=[self._grpc_service(signal) for signal in _SERVICES],
            options=[
                ("grpc.max_receive_message_length", self.limits.grpc_message_bytes),
                ("grpc.so_reuseport", 0),  # a port another server holds is an error, not shared
            ],
        )
        try:
            self.grpc_port = self._grpc.add_insecure_port(f"{_bracketed(host)}:{grpc_port}")
        except RuntimeError as error:  # grpc's word for "cannot bind"
            raise OSError(f"cannot listen for OTLP/gRPC on {_bracketed(host)}:{grpc_port}: {error}") from None
        try:
            self._http = _HttpServer((host, http_port), self, self.limits, self.clock)
        except OSError as error:
            self._grpc.stop(grace=None)
            raise OSError(f"cannot listen for OTLP/HTTP on {_bracketed(host)}:{http_port}: {error}") from None
        self._grpc.start()
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, name="otlp-http", daemon=True).start()
        return self

    def _grpc_service(self, signal: Signal) -> grpc.GenericRpcHandler:
        service, request_type, response_type = _SERVICES[signal]

        def export(body: bytes, context: grpc.ServicerContext) -> Any:
            request = request_type()
            try:
                request.ParseFromString(body)
            except (DecodeError, RecursionError, ValueError):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an OTLP {signal} request")
            refused = self.accept(signal, request)
            if refused is not None:
                context.abort(grpc.StatusCode.UNAVAILABLE, refused)
            return response_type()

        # Raw bytes in: a body that does not parse is ours to answer, not a logged traceback.
        method = grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=lambda message: message.SerializeToString()
        )
        return grpc.method_handlers_generic_handler(service, {"Export": method})

    def accept(self, signal: Signal, request: Any) -> str | None:
        """Store one export request; returns why it is refused, or ``None``."""
        if self.delay:
            self._stopping.wait(self.delay)
        with self._lock:
            self.export_calls += 1
            if self.refuse:
                return "refusing for the test"
            if self.keep:
                getattr(self, signal).append(request)
            self._arrived.notify_all()
        if self.on_request is not None:
            try:
                self.on_request(signal, request)
            except Exception as error:  # the export failed here: the exporter must hear it
                _log.debug("OTLP request not handled", exc_info=True)
                return f"not stored: {type(error).__name__}"
        return None

    def stop(self, grace: float | None = None) -> bool:
        """Stop listening. With ``grace``, requests in flight get that long to finish; returns
        whether they all did."""
        self._stopping.set()
        done = True
        if self._grpc is not None:
            done = self._grpc.stop(grace=grace).wait(grace)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            if grace:
                done = self._http.wait_connections(0, grace) and done
        return done

    @property
    def grpc_endpoint(self) -> str:
        return f"http://{_bracketed(self.host)}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://{_bracketed(self.host)}:{self.http_port}"

    def wait_http_connections(self, count: int, timeout: float) -> bool:
        """Wait until exactly ``count`` HTTP connections are being served."""
        return self._http is not None and self._http.wait_connections(count, timeout)

    def clear(self) -> None:
        with self._lock:
            self.traces.clear()
            self.metrics.clear()
            self.logs.clear()

    # -- what arrived ------------------------------------------------------------------

    def _items(self, signal: str) -> Iterator[tuple[Any, Any]]:
        """(service name, item) for every span, metric or log record of ``signal`` received."""
        with self._lock:
            requests = list(getattr(self, signal))
        resource_key, scope_key, item_key = _LAYOUT[signal]
        for request in requests:
            for resource in getattr(request, resource_key):
                service = attributes(resource.resource.attributes).get("service.name")
                for scope in getattr(resource, scope_key):
                    for item in getattr(scope, item_key):
                        yield service, item

    def spans(self) -> list[dict[str, Any]]:
        return [
            {
                "service": service,
                "name": span.name,
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent_span_id": span.parent_span_id.hex() or None,
                "status": span.status.code,
                "attributes": attributes(span.attributes),
                "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
                "links": [
                    {
                        "trace_id": link.trace_id.hex(),
                        "span_id": link.span_id.hex(),
                        "attributes": attributes(link.attributes),
                    }
                    for link in span.links
                ],
            }
            for service, span in self._items("traces")
        ]

    def failure_events(self, event_name: str = names.EVENT) -> list[dict[str, Any]]:
        """Each failure event with the span it arrived on."""
        return [
            {**event["attributes"], "_span": span}
            for span in self.spans()
            for event in span["events"]
            if event["name"] == event_name
        ]

    def metric_points(self, name: str) -> list[dict[str, Any]]:
        """The latest cumulative value of each (service, attributes) series of ``name``."""
        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for service, metric in self._items("metrics"):
            if metric.name != name:
                continue
            for point in metric.sum.data_points:
                labels = attributes(point.attributes)
                key = (service, tuple(sorted((k, str(v)) for k, v in labels.items())))
                value = point.as_int if point.HasField("as_int") else point.as_double
                latest[key] = {
                    "service": service,
                    "attributes": labels,
                    "value": value,
                    "exemplars": len(point.exemplars),
                }
        return list(latest.values())

    def log_records(self) -> list[dict[str, Any]]:
        return [
            {
                "event_name": record.event_name,
                "attributes": attributes(record.attributes),
                "trace_id": record.trace_id.hex(),
                "span_id": record.span_id.hex(),
            }
            for _, record in self._items("logs")
        ]

    def write_jsonl(self, path: Any) -> int:
        """Every request received so far as OTLP JSON, one per line; returns the line count."""
        with self._lock:
            requests = [*self.traces, *self.metrics, *self.logs]
        with open(path, "w", encoding="utf-8") as out:
            for request in requests:
                out.write(json.dumps(otlp_json(request), separators=(",", ":")) + "\n")
        return len(requests)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
        """Wait until ``predicate`` (over what arrived) holds, checking it at each arrival."""
        with self._arrived:
            return self._arrived.wait_for(predicate, timeout)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
